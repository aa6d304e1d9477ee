"""A RabbitMQ flow opened for one consumer of a run (`RabbitFeed`).

Broker first, then the ledger, then consuming: `check` connects and runs the
start-up checks (the queue, its dead-letter arguments, the retry tiers), so a run
the broker refuses (down, no vhost, no queue) leaves no ledger file behind, and a
bad ledger is still reported before any delivery is taken. With `until_empty` (a
batch job) the run also ends by itself once the queue is drained and nothing is in
flight (how that is known: onceq._sources.amqp.transport).

A stop takes no more deliveries, lets those in flight finish (each bounded by the
effect's timeout, the whole by `grace`), records and settles them, then closes.
Whatever is left unsettled goes back to the queue when the channel closes; the
ledger skips it next time if it was already done.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from onceq._sources.amqp.topology import Topology
from onceq._sources.amqp.transport import AmqpTransport
from onceq._sources.amqp.url import amqp_url
from onceq._sources.feed import BrokerFeed, call_grace

__all__ = ["RabbitFeed"]

log = logging.getLogger("onceq.amqp.consume")  # the name in every log line: kept across moves


class RabbitFeed(BrokerFeed):
    """One consumer of the flow's RabbitMQ queue."""

    tag = "amqp"
    log = log
    task_name = "onceq-mq-consumer"
    unsettled_go = "they return to the queue"

    def __init__(self, flow: Any, until_empty: bool) -> None:
        src = flow.source
        topology = Topology.for_flow(flow)
        # The flow's policy decides what a transient failure leads to; its delays are
        # the retry queues the transport moves copies into (checked to exist at open).
        super().__init__(
            AmqpTransport(
                amqp_url(src.url),
                prefetch=src.prefetch,
                queue=src.queue,
                until_empty=until_empty,
                tiers=tuple(zip(topology.retry_delays, topology.retry_queues, strict=True)),
                # The start-up checks (onceq._sources.amqp.preflight): the flow's dead-letter
                # names, and how long a call may hold a delivery (None for a Python
                # effect: no bound known).
                topology=topology,
                call_timeout=getattr(flow.effect, "timeout", None),
            )
        )
        self.until_empty = until_empty
        # The broker bounds unacked deliveries by prefetch; the loop handles as many at
        # once, so a slow partner sees prefetch calls in parallel.
        self.prefetch = src.prefetch
        self.max_group = max(src.prefetch, 1)
        self.grace = call_grace(flow)
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
            await self.aclose()  # before the ledger closes: nothing unsettled is kept

    def stopped(self) -> Callable[[], bool] | None:
        # A delayed retry is a confirmed copy in a tier queue, then an ack: nothing is
        # held unacked for a delay (the broker's consumer_timeout would close the
        # channel), so the grace covers everything a stop waits for.
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
