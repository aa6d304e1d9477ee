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

import logging
from typing import Any

from onceq._sources.feed import BrokerFeed
from onceq._sources.nats.names import nats_url
from onceq._sources.nats.transport import NatsTransport

__all__ = ["NatsFeed"]

log = logging.getLogger("onceq.nats.consume")


class NatsFeed(BrokerFeed):
    """One consumer of the flow's durable pull consumer."""

    tag = "nats"
    log = log
    task_name = "onceq-nats-consumer"
    unsettled_go = "the server redelivers them"

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
            ),
            flow,
            until_empty,
        )
