"""One consumer run over claim.in: ledger, deadline, signals, bounded grace.

    onceq mq consume --claim URL  →  consume(url, ConsumeOptions(...))  →  Stats

With `until_empty` (a batch job) the run also ends by itself once claim.in is
drained and nothing is in flight (how that is known: onceq.amqp.transport).

The run stops taking deliveries at the deadline (--max-seconds) or on SIGTERM /
SIGINT, lets the deliveries in flight finish (each bounded by the HTTP timeout,
the whole by `grace`), records and settles them, then closes. Whatever is left
unsettled goes back to claim.in when the channel closes; the ledger skips it
next time if it was already done.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onceq.consumer import Consumer, Stats
from onceq.ledger import Entry, Ledger
from onceq.processed_table import PROCESSED_TABLE

log = logging.getLogger(__name__)

ENV_DB = "EAI_MQ_DB"
DEFAULT_DB = "processed.db"
DEFAULT_PREFETCH = 5
DEFAULT_TIMEOUT = 10.0
# A transient failure is retried once (requeue), then dead-lettered.
MAX_ATTEMPTS = 2


def default_db(fallback_dir: Path | None = None) -> Path:
    """EAI_MQ_DB, else processed.db in `fallback_dir` (the lab folder) or the cwd."""
    env = os.environ.get(ENV_DB)
    if env:
        return Path(env)
    return (fallback_dir or Path.cwd()) / DEFAULT_DB


@dataclass(frozen=True)
class ConsumeOptions:
    claim_url: str
    db: Path
    prefetch: int = DEFAULT_PREFETCH
    max_seconds: float | None = None
    timeout: float = DEFAULT_TIMEOUT
    until_empty: bool = False

    @property
    def grace(self) -> float:
        """How long stopping may take: one HTTP timeout plus the commit and settle."""
        return self.timeout + 5.0


@dataclass
class ConsumeResult:
    stats: Stats
    unsettled: int
    db: Path
    aborted: bool = False  # a second signal cut the grace short
    signal: int | None = None  # the first stop signal, if one came
    abort_signal: int | None = None  # the signal that cut the grace short (aborted)
    drained: bool | None = None  # until_empty: the queue was drained (None otherwise)

    def as_dict(self) -> dict[str, Any]:
        out = {
            **self.stats.as_dict(),
            "unsettled": self.unsettled,
            "db": str(self.db),
            "aborted": self.aborted,
        }
        if self.drained is not None:
            out["drained"] = self.drained
        return out


def consume(
    url: str,
    opts: ConsumeOptions,
    *,
    on_settled: Callable[[Sequence[Entry]], None] | None = None,
    on_new_ledger: Callable[[Path], None] | None = None,
) -> ConsumeResult:
    """Run a consumer until the deadline or a signal; returns what it did.

    `on_new_ledger(path)` is called when the run made its ledger (it has seen nothing).
    """
    return asyncio.run(_consume(url, opts, on_settled, on_new_ledger))


async def _consume(
    url: str,
    opts: ConsumeOptions,
    on_settled: Callable[[Sequence[Entry]], None] | None,
    on_new_ledger: Callable[[Path], None] | None,
) -> ConsumeResult:
    from onceq.amqp.handler import ClaimHandler, decode
    from onceq.amqp.transport import AmqpTransport

    handler = ClaimHandler(opts.claim_url, concurrency=opts.prefetch, timeout=opts.timeout)
    transport = AmqpTransport(url, prefetch=opts.prefetch, until_empty=opts.until_empty)
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    ledger: Ledger | None = None
    try:
        # Broker first, then the ledger, then consuming: a run that the broker refuses
        # (down, no vhost, no claim.in) leaves no ledger file behind, and a bad --db is
        # still reported before any delivery is taken.
        await transport.open()
        # The claims preset writes the exercise's `processed` table in the ledger's
        # transaction (onceq.processed_table), as 0.1.0 did.
        ledger = Ledger(opts.db, source="amqp", sql=PROCESSED_TABLE)
        if ledger.created and on_new_ledger is not None:
            on_new_ledger(opts.db)
        await transport.start()
        consumer = Consumer(
            transport,
            ledger,
            decode,
            handler,
            # The broker bounds unacked deliveries by prefetch; the loop handles as many
            # at once, so a slow claim system sees prefetch calls in parallel.
            max_in_flight=opts.prefetch,
            max_group=max(opts.prefetch, 1),
            max_attempts=MAX_ATTEMPTS,
            on_settled=on_settled,
        )
        abort = asyncio.Event()
        stopped_by: list[int] = []

        def on_signal(signum: int) -> None:
            # The first signal stops cleanly (in-flight claims finish, bounded by the
            # grace). A second one is an operator who will not wait: stop at once.
            # Nothing is lost: unsettled deliveries return to claim.in when the channel
            # closes, and the ledger skips the ones whose record was already durable.
            if transport.stopped.is_set():
                abort.set()
            stopped_by.append(signum)
            # consumer.stop, not transport.stop: a real stop also means no new claim
            # call starts for deliveries received but not yet called.
            consumer.stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
            handled.append(sig)
        if opts.max_seconds is not None:
            loop.call_later(opts.max_seconds, consumer.stop)
        run = asyncio.create_task(consumer.run(), name="onceq-mq-consumer")
        stop_wait = asyncio.create_task(transport.stopped.wait())
        await asyncio.wait([run, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        stop_wait.cancel()
        if not run.done():
            abort_wait = asyncio.create_task(abort.wait())
            await asyncio.wait(
                [run, abort_wait], timeout=opts.grace, return_when=asyncio.FIRST_COMPLETED
            )
            abort_wait.cancel()
            if not run.done():
                if not abort.is_set():
                    log.warning(
                        "in-flight deliveries did not finish within %.0fs; they return to %s",
                        opts.grace,
                        "the queue",
                    )
                run.cancel()
                await asyncio.gather(run, return_exceptions=True)
                return _result(consumer.stats, transport, opts, stopped_by, abort.is_set())
        stats = run.result()  # raises the ledger's error, if it failed
        return _result(stats, transport, opts, stopped_by, False)
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        await transport.close()
        await handler.aclose()
        if ledger is not None:
            ledger.close()


def _result(
    stats: Stats, transport: Any, opts: ConsumeOptions, stopped_by: list[int], aborted: bool
) -> ConsumeResult:
    return ConsumeResult(
        stats,
        transport.unsettled,
        opts.db,
        aborted=aborted,
        signal=stopped_by[0] if stopped_by else None,
        abort_signal=stopped_by[-1] if aborted and stopped_by else None,
        # Drained only if the transport saw the queue empty: a stop (signal, deadline)
        # that came first leaves the batch unfinished, whatever it had settled.
        drained=transport.drained if opts.until_empty else None,
    )
