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

import logging
from typing import Any

from onceq._sources.amqp.topology import Topology
from onceq._sources.amqp.transport import AmqpTransport
from onceq._sources.amqp.url import amqp_url
from onceq._sources.feed import BrokerFeed

__all__ = ["RabbitFeed"]

log = logging.getLogger("onceq.amqp.consume")  # the name in every log line: kept across moves


class RabbitFeed(BrokerFeed):
    """One consumer of the flow's RabbitMQ queue.

    A delayed retry is a confirmed copy in a tier queue, then an ack: nothing is held
    unacked for a delay (the broker's consumer_timeout would close the channel), so the
    grace covers everything a stop waits for.
    """

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
            ),
            flow,
            until_empty,
        )
