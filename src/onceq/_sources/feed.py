"""A flow's source opened for one consumer of a run: what the runner drives.

    feed = source_type.open(flow, until_empty=True)   # onceq._sources.registry
    await feed.check()              # the queue folder is there, the broker has the queue
    ...                             # (every flow's check passed: the ledger is opened)
    async with feed.consuming() as transport:   # claim folder made / consuming started
        consumer = Consumer(transport, ledger, ..., max_in_flight=feed.max_in_flight(calls))
        stats = await feed.drive(consumer, stop)
    feed.report()                   # {"drained": …, "unsettled": …} for a broker
    await feed.aclose()

The runner (onceq._flows.runner) is the one place that wires a consume run: signals,
the ledger, the Consumer, telemetry. A kind of source says only what is its own:
how it is checked before any ledger is opened, how consuming starts and ends, how
many copies the loop holds and groups, what a stop may wait for, what its run adds
to the report. This base is a library user's own transport (a MemoryTransport): no
check, nothing to start, the loop's defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from onceq._core.stats import Stats
from onceq._core.stop import Stop

__all__ = ["DEFAULT_TIMEOUT", "BrokerFeed", "Feed", "call_grace"]

DEFAULT_TIMEOUT = 10.0  # s: a call effect's timeout when the flow's effect has none


def call_grace(flow: Any) -> float:
    """How long a broker consumer's stop may take: one call's timeout plus the commit
    and settle of what was in flight (RabbitMQ's and NATS's feeds)."""
    value = getattr(flow.effect, "timeout", None)
    timeout = float(value) if isinstance(value, int | float) else DEFAULT_TIMEOUT
    return timeout + 5.0


class Feed:
    """One consumer's source in a run. Subclasses override what their kind has."""

    tag = "memory"  # the ledger's `source` tag of this flow's rows
    dead_word = "dead"  # a dead letter's name in the summaries ("quarantined": error/)
    max_group = 512  # outcomes in one commit at most

    def __init__(self, transport: Any = None) -> None:
        self.transport = transport

    def max_in_flight(self, calls: bool) -> int:
        """Deliveries the loop holds at once (`calls`: the flow has a call effect)."""
        return 256

    async def check(self) -> None:
        """Refuse a source that cannot run, before any ledger is opened (nothing made)."""

    @contextlib.asynccontextmanager
    async def consuming(self) -> AsyncIterator[Any]:
        """The transport, ready to deliver, while inside (the ledger is open by now)."""
        yield self.transport

    def stopped(self) -> Callable[[], bool] | None:
        """How a stop tells that this consumer already stopped on its own (a drained
        queue: a signal then counts as a second one), or None."""
        return None

    async def drive(self, consumer: Any, stop: Stop) -> Stats:
        """Run the consumer to its end; a stop's finishing is bounded only by the calls."""
        stats: Stats = await consumer.run()
        return stats

    def report(self) -> dict[str, Any]:
        """What this kind adds to a flow's result (a broker: drained, unsettled)."""
        return {}

    async def aclose(self) -> None:
        """Let go of whatever `check` took (a broker connection)."""


class BrokerFeed(Feed):
    """A broker's consumer (RabbitMQ, NATS): it runs until its transport is stopped, and
    a stop may take `grace` seconds to finish what is in flight.

    What both brokers share lives here: the loop's bounds from the flow's prefetch, a
    check that opens the transport (so a broker that refuses leaves no ledger behind),
    consuming between the transport's start and close, and the drained/unsettled
    report. The transport has `open`, `start`, `close`, `stopped` (an Event),
    `drained` and `unsettled`. Subclasses build the transport and set `log`,
    `task_name` and `unsettled_go` (where unfinished copies go, for the grace's warning).
    """

    log = logging.getLogger("onceq.consume")
    task_name = "onceq-consumer"
    unsettled_go = "they return to the queue"
    grace = DEFAULT_TIMEOUT + 5.0

    def __init__(self, transport: Any, flow: Any, until_empty: bool) -> None:
        super().__init__(transport)
        self.aborted = False  # a second signal cut the grace short
        self.until_empty = until_empty
        self._closed = False
        # The broker bounds unacked deliveries by prefetch (a NATS pull brings as many);
        # the loop handles as many at once, so a slow partner sees prefetch calls in
        # parallel, and one commit groups at most that many outcomes.
        self.prefetch = int(flow.source.prefetch)
        self.max_group = max(self.prefetch, 1)
        self.grace = call_grace(flow)

    async def drive(self, consumer: Any, stop: Stop) -> Stats:
        """Run the consumer until it ends or the stop; the grace bounds a stop's finishing.

        A second signal is an operator who will not wait (`stop.abort`): stop at once.
        Nothing is lost: unsettled copies return to the queue when the channel closes (a
        NATS server redelivers them), and the ledger skips the ones whose record was
        already durable.
        """
        run = asyncio.create_task(consumer.run(), name=self.task_name)
        stop_wait = asyncio.create_task(self.transport.stopped.wait())
        await asyncio.wait([run, stop_wait], return_when=asyncio.FIRST_COMPLETED)
        stop_wait.cancel()
        if not run.done():
            abort_wait = asyncio.create_task(stop.abort.wait())
            await asyncio.wait(
                [run, abort_wait], timeout=self.grace, return_when=asyncio.FIRST_COMPLETED
            )
            abort_wait.cancel()
            if not run.done():
                if not stop.abort.is_set():
                    self.log.warning(
                        "in-flight deliveries did not finish within %.0fs; %s",
                        self.grace,
                        self.unsettled_go,
                        extra={"event": "grace-expired"},
                    )
                run.cancel()
                await asyncio.gather(run, return_exceptions=True)
                self.aborted = stop.abort.is_set()
                stats: Stats = consumer.stats
                return stats
        result: Stats = run.result()  # raises the ledger's error, if it failed
        return result

    def max_in_flight(self, calls: bool) -> int:
        return self.prefetch

    async def check(self) -> None:
        await self.transport.open()

    @contextlib.asynccontextmanager
    async def consuming(self) -> AsyncIterator[Any]:
        await self.transport.start()
        try:
            yield self.transport
        finally:
            await self.aclose()  # before the ledger closes: nothing unsettled is kept

    def stopped(self) -> Callable[[], bool] | None:
        stopped: Callable[[], bool] = self.transport.stopped.is_set
        return stopped

    def report(self) -> dict[str, Any]:
        # Drained only if the transport saw the queue empty: a stop (signal, deadline)
        # that came first leaves the batch unfinished, whatever it had settled.
        return {
            "drained": bool(self.transport.drained) if self.until_empty else False,
            "unsettled": self.transport.unsettled,
            "aborted": self.aborted,
        }

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self.transport.close()
