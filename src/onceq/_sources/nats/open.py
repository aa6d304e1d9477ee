"""A NATS flow opened for one consumer of a run (`NatsFeed`).

Server first, then the ledger, then consuming: `check` connects and checks the durable
consumer and the dead-letter stream, so a run the server refuses (down, no stream, no
consumer) leaves no ledger file behind. With `until_empty` (a batch job) the run ends
by itself once the consumer has nothing left (onceq._sources.nats.transport).

A stop takes no more copies, lets those in flight finish (each bounded by the
effect's timeout, the whole by the grace), records and settles them, then closes.
What is left unsettled is redelivered by the server after its AckWait; the ledger
skips it next time if it was already done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from onceq._core.stats import Stats
from onceq._core.stop import Stop
from onceq._sources.feed import Feed
from onceq._sources.nats.names import nats_url
from onceq._sources.nats.transport import NatsTransport

__all__ = ["NatsFeed", "grace"]

log = logging.getLogger("onceq.nats.consume")

DEFAULT_TIMEOUT = 10.0


def grace(flow: Any) -> float:
    """How long stopping may take: one call's timeout plus the commit and settle."""
    value = getattr(flow.effect, "timeout", None)
    timeout = float(value) if isinstance(value, int | float) else DEFAULT_TIMEOUT
    return timeout + 5.0


class NatsFeed(Feed):
    """One consumer of the flow's durable pull consumer."""

    tag = "nats"

    def __init__(self, flow: Any, until_empty: bool) -> None:
        src = flow.source
        super().__init__(
            NatsTransport(
                nats_url(src.url),
                stream=src.stream,
                durable=src.durable,
                prefetch=src.prefetch,
                until_empty=until_empty,
                dead_subject=src.dead_subject,
            )
        )
        self.until_empty = until_empty
        # The loop handles as many copies at once as one pull may bring.
        self.prefetch = src.prefetch
        self.max_group = max(src.prefetch, 1)
        self.grace = grace(flow)
        self.aborted = False
        self._closed = False

    def max_in_flight(self, calls: bool) -> int:
        return int(self.prefetch)

    async def check(self) -> None:
        await self.transport.open()

    @contextlib.asynccontextmanager
    async def consuming(self) -> AsyncIterator[Any]:
        await self.transport.start()
        try:
            yield self.transport
        finally:
            await self.aclose()  # before the ledger closes

    def stopped(self) -> Callable[[], bool] | None:
        stopped: Callable[[], bool] = self.transport.stopped.is_set
        return stopped

    async def drive(self, consumer: Any, stop: Stop) -> Stats:
        """Run the consumer until it ends or the stop; the grace bounds a stop's finishing.

        A second signal (`stop.abort`) stops at once: unsettled copies are redelivered
        by the server, and the ledger skips those whose record was already durable.
        """
        transport = self.transport
        run = asyncio.create_task(consumer.run(), name="onceq-nats-consumer")
        stop_wait = asyncio.create_task(transport.stopped.wait())
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
                    log.warning(
                        "in-flight deliveries did not finish within %.0fs; the server"
                        " redelivers them",
                        self.grace,
                        extra={"event": "grace-expired"},
                    )
                run.cancel()
                await asyncio.gather(run, return_exceptions=True)
                self.aborted = stop.abort.is_set()
                stats: Stats = consumer.stats
                return stats
        result: Stats = run.result()
        return result

    def report(self) -> dict[str, Any]:
        return {
            "drained": bool(self.transport.drained) if self.until_empty else False,
            "unsettled": self.transport.unsettled,
            "aborted": self.aborted,
        }

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self.transport.close()
