"""One consumer run over a RabbitMQ flow's queue: ledger, deadline, signals, bounded grace.

    onceq mq consume --claim URL  →  consume(url, ConsumeOptions(...))  →  Stats
    onceq mq consume --queue Q --url U  →  consume(url, opts, flow=Flow(...))
    onceq run FILE (a rabbitmq flow)  →  consume_flow(flow, opts, stop=…)

With `until_empty` (a batch job) the run also ends by itself once the queue is
drained and nothing is in flight (how that is known: onceq.sources.amqp.transport).

The run stops taking deliveries at the deadline (--max-seconds) or on SIGTERM /
SIGINT, lets the deliveries in flight finish (each bounded by the HTTP timeout,
the whole by `grace`), records and settles them, then closes. Whatever is left
unsettled goes back to the queue when the channel closes; the ledger skips it
next time if it was already done.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceq.core.consumer import Consumer, Stats
from onceq.ledger.sqlite import Entry
from onceq.ledger.target import Target, as_target, describe

if TYPE_CHECKING:
    from onceq.flows.flow import Flow
    from onceq.flows.runner import Stop
    from onceq.ops.telemetry import Telemetry

log = logging.getLogger("onceq.amqp.consume")  # the name in every log line: kept across moves

ENV_DB = "EAI_MQ_DB"
DEFAULT_DB = "processed.db"
DEFAULT_PREFETCH = 5
DEFAULT_TIMEOUT = 10.0


def default_db(fallback_dir: Path | None = None) -> Target:
    """EAI_MQ_DB, else processed.db in `fallback_dir` (the lab folder) or the cwd.

    EAI_MQ_DB may be a postgresql:// URL (a ledger shared by consumers on many hosts);
    a mistyped one is refused here, naming the variable, its password masked.
    """
    env = os.environ.get(ENV_DB)
    if env:
        return as_target(env, ENV_DB)
    return (fallback_dir or Path.cwd()) / DEFAULT_DB


@dataclass(frozen=True)
class ConsumeOptions:
    """How one run goes (the flow says what it consumes and does).

    `claim_url`, `prefetch` and `timeout` build the claims preset when `consume` is
    given no flow (today's `mq consume --claim`).
    """

    claim_url: str = ""
    db: Target = Path(DEFAULT_DB)  # a path or a postgresql:// URL
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
    db: Target
    aborted: bool = False  # a second signal cut the grace short
    signal: int | None = None  # the first stop signal, if one came
    abort_signal: int | None = None  # the signal that cut the grace short (aborted)
    drained: bool | None = None  # until_empty: the queue was drained (None otherwise)

    def as_dict(self) -> dict[str, Any]:
        out = {
            **self.stats.as_dict(),
            "unsettled": self.unsettled,
            "db": describe(self.db),  # a URL without its password
            "aborted": self.aborted,
        }
        if self.drained is not None:
            out["drained"] = self.drained
        return out


def consume(
    url: str,
    opts: ConsumeOptions,
    *,
    flow: Flow | None = None,
    on_settled: Callable[[Sequence[Entry]], None] | None = None,
    on_new_ledger: Callable[[Target], None] | None = None,
    telemetry: Telemetry | None = None,
) -> ConsumeResult:
    """Run a consumer until the deadline or a signal; returns what it did.

    `flow` is a Flow over a RabbitSource (default: the claims preset from `opts`);
    `url` is the broker's, used when the source names none.
    `on_new_ledger(path)` is called when the run made its ledger (it has seen nothing).
    `telemetry` serves /metrics and /healthz from before the broker is asked until
    after the final counts (its port bound first: a port in use consumes nothing).
    """
    if flow is None:
        from onceq.exercise.flows import claims_flow

        flow = claims_flow(opts.claim_url, url=url, prefetch=opts.prefetch, timeout=opts.timeout)
    elif flow.source.url is None:
        flow = dataclasses.replace(flow, source=dataclasses.replace(flow.source, url=url))
    flow.validate()
    from onceq.ops.telemetry import Telemetry

    tel = telemetry or Telemetry()
    tel.bind()

    async def served() -> ConsumeResult:
        async with tel.serving():
            return await consume_flow(
                flow, opts, on_settled=on_settled, on_new_ledger=on_new_ledger, telemetry=tel
            )

    return asyncio.run(served())


async def consume_flow(
    flow: Flow,
    opts: ConsumeOptions,
    *,
    on_settled: Callable[[Sequence[Entry]], None] | None = None,
    on_new_ledger: Callable[[Target], None] | None = None,
    stop: Stop | None = None,
    before_ledger: Callable[[], Awaitable[None]] | None = None,
    telemetry: Telemetry | None = None,
) -> ConsumeResult:
    """One consumer of a RabbitMQ flow: the loop `mq consume` and `onceq run` share.

    Without `stop` it handles this process's signals itself (`mq consume`: a second
    signal cuts the grace short); with one, the caller does (`onceq run`: one stop for
    every flow). `before_ledger` is awaited once the broker has the queue and before
    the ledger is opened. `telemetry` watches the consumer (its server is the caller's).
    """
    from onceq.ops.telemetry import Telemetry

    tel = telemetry or Telemetry()
    with tel.flow_context(flow.name):
        return await _consume_flow(flow, opts, on_settled, on_new_ledger, stop, before_ledger, tel)


async def _consume_flow(
    flow: Flow,
    opts: ConsumeOptions,
    on_settled: Callable[[Sequence[Entry]], None] | None,
    on_new_ledger: Callable[[Target], None] | None,
    stop: Stop | None,
    before_ledger: Callable[[], Awaitable[None]] | None,
    telemetry: Telemetry,
) -> ConsumeResult:
    from onceq.core.consumer import no_effect
    from onceq.flows.flow import close_effect, open_ledger
    from onceq.flows.runner import Stop
    from onceq.sources.amqp.topology import Topology
    from onceq.sources.amqp.transport import AmqpTransport
    from onceq.sources.amqp.url import amqp_url

    own_signals = stop is None
    if stop is None:
        stop = Stop(second="abort", respect_ignored=False)
    src = flow.source
    handler = flow.handler()
    # The flow's policy decides what a transient failure leads to; its delays are the
    # retry queues the transport moves copies into (checked to exist at open).
    retry = flow.retry_policy()
    topology = Topology.for_flow(flow)
    transport = AmqpTransport(
        amqp_url(src.url),
        prefetch=src.prefetch,
        queue=src.queue,
        until_empty=opts.until_empty,
        tiers=tuple(zip(topology.retry_delays, topology.retry_queues, strict=True)),
        # The start-up checks (onceq.sources.amqp.preflight): the flow's dead-letter names, and
        # how long a call may hold a delivery (None for a Python effect: no bound known).
        topology=topology,
        call_timeout=getattr(flow.effect, "timeout", None),
    )
    ledger: Any = None  # Ledger | PgLedger (onceq.ledger.target.open_ledger)
    # From before the broker is asked: a signal while it connects or the ledger opens
    # stops the run as one during consuming does (exit 0, or 130/143 for a batch).
    signals = stop.installed() if own_signals else contextlib.nullcontext(stop)
    try:
        with signals:
            # Broker first, then the ledger, then consuming: a run that the broker refuses
            # (down, no vhost, no queue) leaves no ledger file behind, and a bad --db is
            # still reported before any delivery is taken.
            await transport.open()
            if before_ledger is not None:
                await before_ledger()
            if stop.requested:  # stopped while it started: nothing taken, no ledger made
                return _result(Stats(), transport, opts, stop.signals, False)
            ledger = open_ledger(flow, opts.db, "amqp")
            if ledger.created and on_new_ledger is not None:
                on_new_ledger(opts.db)
            await transport.start()
            consumer = Consumer(
                transport,
                ledger,
                flow.message.decode,
                handler or no_effect,
                # The broker bounds unacked deliveries by prefetch; the loop handles as many
                # at once, so a slow partner sees prefetch calls in parallel.
                max_in_flight=src.prefetch,
                max_group=max(src.prefetch, 1),
                on_settled=on_settled,
                # A delayed retry is a confirmed copy in a tier queue, then an ack: nothing
                # is held unacked for a delay (the broker's consumer_timeout, 30 min by
                # default, would close the channel), so the grace below covers it.
                retry=retry,
                breaker=flow.breaker_policy(),
                guard=flow.misconfig_guard(),
            )
            # The first signal stops cleanly (in-flight calls finish, bounded by the grace).
            # A second one is an operator who will not wait: stop at once. Nothing is lost:
            # unsettled deliveries return to the queue when the channel closes, and the
            # ledger skips the ones whose record was already durable. consumer.stop, not
            # transport.stop: a real stop also means no new call starts for deliveries
            # received but not yet called.
            stop.add(consumer.stop, stopped=transport.stopped.is_set)
            async with telemetry.track(flow, consumer, transport):
                return await _drive(consumer, transport, opts, stop)
    finally:
        await transport.close()
        await close_effect(handler)
        if ledger is not None:
            ledger.close()


async def _drive(
    consumer: Consumer, transport: Any, opts: ConsumeOptions, stop: Stop
) -> ConsumeResult:
    """Run the consumer until it ends or the stop; the grace bounds a stop's finishing."""
    loop = asyncio.get_running_loop()
    if opts.max_seconds is not None:
        loop.call_later(opts.max_seconds, stop.request)
    run = asyncio.create_task(consumer.run(), name="onceq-mq-consumer")
    stop_wait = asyncio.create_task(transport.stopped.wait())
    await asyncio.wait([run, stop_wait], return_when=asyncio.FIRST_COMPLETED)
    stop_wait.cancel()
    if not run.done():
        abort_wait = asyncio.create_task(stop.abort.wait())
        await asyncio.wait(
            [run, abort_wait], timeout=opts.grace, return_when=asyncio.FIRST_COMPLETED
        )
        abort_wait.cancel()
        if not run.done():
            if not stop.abort.is_set():
                log.warning(
                    "in-flight deliveries did not finish within %.0fs; they return to %s",
                    opts.grace,
                    "the queue",
                    extra={"event": "grace-expired"},
                )
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            return _result(consumer.stats, transport, opts, stop.signals, stop.abort.is_set())
    stats = run.result()  # raises the ledger's error, if it failed
    return _result(stats, transport, opts, stop.signals, False)


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
