"""RabbitMQ as a source type: `source = "rabbitmq"` in a flow file, `RabbitSource` in Python.

Everything the generic layers ask of a RabbitMQ flow is answered here (its flow-file
keys and their checks, its depths for /metrics and `onceq status`, its health); the
registry (onceq._sources.registry) finds it by `RabbitSource`. aio-pika and aiohttp
are imported by the modules this one calls, when they connect, not here.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from onceq._core.keys import Mistakes, check, get
from onceq._core.url_check import check_url
from onceq._sources.amqp.depths import RabbitDepths, labelled
from onceq._sources.amqp.open import RabbitFeed
from onceq._sources.amqp.status import flow_depths
from onceq._sources.amqp.topology import Topology
from onceq._sources.dead_api import DeadAction, DeadItem, DeadSelection
from onceq._sources.registry import SourceType
from onceq.errors import OnceqError

__all__ = ["DEFAULT_PREFETCH", "RABBITMQ", "RabbitSource", "RabbitType", "rabbit_of"]

log = logging.getLogger("onceq.metrics_queues")  # the name its warning has always had

DEFAULT_PREFETCH = 5
BROKER_TIMEOUT = 10.0  # s per flow in `onceq status`: a broker that does not answer is a reason
# The flow-file keys naming the queue's companions (`mq topology --flows` declares them).
NAME_KEYS = ("dead_letter_exchange", "dead_letter_queue", "exchange", "queue_type", "routing_key")


@dataclass(frozen=True)
class RabbitSource:
    """A RabbitMQ queue by name; the exchange and dead-letter names are for `mq topology`.

    `url` None means EAI_AMQP_URL, else the default local broker.
    """

    queue: str
    exchange: str | None = None
    routing_key: str | None = None
    dead_letter_exchange: str | None = None
    dead_letter_queue: str | None = None
    url: str | None = None
    prefetch: int = DEFAULT_PREFETCH
    # "classic" | "quorum": the type `mq topology --flows` declares its queues with (None:
    # classic); the consumer checks the work queue's dead-letter arguments of that type.
    queue_type: str | None = None


def rabbit_of(source: object) -> RabbitSource | None:
    """The source as a RabbitMQ source, or None when it is another kind: the `mq` commands
    pick their flows with it, so the question "is this RabbitMQ?" is asked only here."""
    return cast(RabbitSource, source) if RABBITMQ.accepts(source) else None


class RabbitType(SourceType):
    kind = "rabbitmq"
    config = RabbitSource
    # id_property belongs to the message spec, but only a RabbitMQ delivery has one.
    file_keys = frozenset({"url", "queue", "prefetch", "id_property", *NAME_KEYS})
    fault_points = {  # noqa: RUF012  (onceq._core.faults; read only)
        "after-delay-publish": "a group's retry-tier copies confirmed, no original acked",
    }
    log_events = {  # noqa: RUF012  (onceq._core.logs.EVENTS has the engine's)
        "skipped-closed-channel": "a delivery whose channel closed before it was handled",
        "cancel-failed": "cancelling the consumer at a stop failed (its channel was gone)",
        "pause-failed": "pausing the consumer (breaker open) failed: the broker returns them",
        "resume-failed": "resuming the consumer failed: tried again in 1 s",
        "probe-failed": "the breaker's probe (basic.get) failed: tried again",
        "retry-copy-unconfirmed": (
            "a retry tier copy was not confirmed: given back to the queue; `cause` says why"
        ),
        "channel-closed": (
            "the broker closed the consume channel (403, 404 …; `cause`): reopening it"
        ),
        "channel-reopened": "the consume channel the broker had closed is open again",
        "dead-letter-unchecked": "the work queue's dead-letter arguments could not be read",
        "delivery-limit": "a quorum queue's delivery limit would decide before onceq does",
        "consumer-timeout": "the broker's consumer_timeout would cut a delivery onceq still holds",
        "consumer-timeout-unread": "the consumer_timeout could not be read or compared (debug)",
        "depths-unavailable": "no queue depths for a flow (a mistyped management API URL)",
        "management-api-unusable": (
            "the RabbitMQ management API does not answer: no unacked figures"
        ),
    }

    def validate(self, source: RabbitSource, flow: Any, where: str) -> str | None:
        if not isinstance(source.queue, str) or not source.queue:
            return "a RabbitMQ source needs a queue name"
        if not isinstance(source.prefetch, int) or not 1 <= source.prefetch <= 65535:
            return f"prefetch must be 1-65535, not {source.prefetch}"
        return None

    def from_table(
        self, table: dict[str, Any], where: str, base: Path, m: Mistakes
    ) -> RabbitSource | None:
        queue = get(table, "queue", str, m, where, required=True)
        url = get(table, "url", str, m, where)
        if url is not None:
            check(m, f"{where}.url", check_url, url, "", ("amqp", "amqps"), "a broker's port")
        prefetch = get(table, "prefetch", int, m, where, DEFAULT_PREFETCH)
        if isinstance(prefetch, int) and not 1 <= prefetch <= 65535:
            m.add(f"{where}.prefetch", f"must be 1-65535, not {prefetch}")
        names = {k: get(table, k, str, m, where) for k in NAME_KEYS}
        if not queue:
            return None
        source = RabbitSource(queue, url=url, prefetch=prefetch, **names)
        # The names `mq topology --flows` declares, checked as the CLI's options are,
        # each mistake named by its key: found by `onceq check`, not by the broker.
        for line in Topology.for_source(source).problems(lambda f: f"{where}.{f}"):
            key, _, why = line.partition(": ")
            m.add(key, why)
        return source

    def depth_reader(self, flow: Any, transport: Any) -> RabbitDepths | None:
        try:
            return RabbitDepths(transport.url, flow)
        except OnceqError as exc:  # EAI_RABBITMQ_API mistyped: the figures, not the run
            log.warning(
                "no queue depths for flow %s: %s",
                flow.name,
                exc,
                extra={"event": "depths-unavailable"},
            )
            return None

    async def status_depths(
        self, flow: Any, api: str | None, now: datetime
    ) -> tuple[dict[str, Any] | None, str | None]:
        try:
            return await asyncio.wait_for(flow_depths(flow, api), BROKER_TIMEOUT), None
        except TimeoutError:
            return None, f"the broker did not answer within {BROKER_TIMEOUT:.0f}s"

    def problem(self, flow: Any, transport: Any) -> str | None:
        return None if transport.connected else "broker connection lost"

    def labelled_depths(self, queue: dict[str, Any]) -> list[dict[str, Any]]:
        return labelled(queue)

    def open(self, flow: Any, until_empty: bool) -> RabbitFeed:
        return RabbitFeed(flow, until_empty)

    dead_actions = frozenset({"replay", "purge"})

    async def dead_items(
        self, flow: Any, ledger: Any, selection: DeadSelection, *, bodies: bool = False
    ) -> list[DeadItem]:
        # why: aiormq loads when a dead-letter queue is read, not with the source type
        from onceq._sources.amqp import dead_items

        return await dead_items.items(flow, ledger, selection, bodies=bodies)

    async def dead_action(
        self, action: str, flow: Any, ledger: Any, selection: DeadSelection
    ) -> DeadAction:
        if action not in self.dead_actions:
            return await super().dead_action(action, flow, ledger, selection)
        from onceq._sources.amqp import dead_items

        return await dead_items.action(action, flow, ledger, selection)

    def flag_keys(self) -> dict[str, str]:
        return {"queue": "queue", "prefetch": "prefetch"}  # mq consume --queue Q --prefetch N


RABBITMQ = RabbitType()
