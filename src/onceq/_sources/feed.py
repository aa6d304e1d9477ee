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

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from onceq._core.stats import Stats
from onceq._core.stop import Stop

__all__ = ["Feed"]


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
