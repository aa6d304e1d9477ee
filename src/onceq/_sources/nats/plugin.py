"""NATS JetStream as a source type: `source = "nats"` in a flow file, `NatsSource` in Python.

Everything the generic layers ask of a NATS flow is answered here (its flow-file keys
and their checks, its depths for `onceq status`, its health); the registry
(onceq._sources.registry) finds it by `NatsSource`. nats-py is imported by the
modules this one calls, when they connect, not here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from onceq._core.keys import Mistakes, check, get
from onceq._core.retry import parse_duration
from onceq._core.url_check import check_url
from onceq._sources.dead_api import DeadAction, DeadItem, DeadSelection
from onceq._sources.nats import dead
from onceq._sources.nats.depths import NatsDepths, consumer_depths, labelled
from onceq._sources.nats.names import (
    DEFAULT_ACK_WAIT,
    DEFAULT_MAX_ACK_PENDING,
    DEFAULT_PREFETCH,
    nats_url,
)
from onceq._sources.nats.open import NatsFeed
from onceq._sources.nats.setup import Setup
from onceq._sources.registry import SourceType
from onceq.errors import UsageError

__all__ = ["NATS", "NatsSource", "NatsType", "nats_of"]

SERVER_TIMEOUT = 10.0  # s per flow in `onceq status`


@dataclass(frozen=True)
class NatsSource:
    """A durable pull consumer `durable` of the JetStream stream `stream`.

    `subject`, `ack_wait`, `max_ack_pending`, `max_deliver` and `dead_subject` are
    what `onceq nats setup --flows` creates (the consumer reads its own settings from
    the server). `url` None means ONCEQ_NATS_URL, else nats://127.0.0.1:4222.
    """

    stream: str
    durable: str
    subject: str | None = None
    url: str | None = None
    prefetch: int = DEFAULT_PREFETCH
    ack_wait: float = DEFAULT_ACK_WAIT
    max_ack_pending: int = DEFAULT_MAX_ACK_PENDING
    max_deliver: int = -1
    dead_subject: str | None = None

    def setup(self) -> Setup:
        """What `onceq nats setup` creates for it (a subject is needed)."""
        return Setup(
            stream=self.stream,
            subject=self.subject or "",
            durable=self.durable,
            dead_subject=self.dead_subject,
            ack_wait=self.ack_wait,
            max_ack_pending=self.max_ack_pending,
            max_deliver=self.max_deliver,
        )


def nats_of(source: object) -> NatsSource | None:
    """The source as a NATS source, or None: the `nats` commands pick their flows with it."""
    return cast(NatsSource, source) if NATS.accepts(source) else None


class NatsType(SourceType):
    kind = "nats"
    config = NatsSource
    # id_property: the Nats-Msg-Id header is the id, else the body's id field.
    file_keys = frozenset(
        {
            "url",
            "stream",
            "subject",
            "durable",
            "prefetch",
            "ack_wait",
            "max_ack_pending",
            "max_deliver",
            "dead_subject",
            "id_property",
        }
    )
    fault_points = {  # noqa: RUF012  (onceq._core.faults; read only)
        "after-dead-publish": "a group's dead letters stored, no original acked",
    }
    log_events = {  # noqa: RUF012  (onceq._core.logs.EVENTS has the engine's)
        "dead-letter-unstored": (
            "a dead letter got no PubAck: its original is NAKed, tried again shortly"
        ),
    }

    def validate(self, source: NatsSource, flow: Any, where: str) -> str | None:
        if not isinstance(source.prefetch, int) or not 1 <= source.prefetch <= 65535:
            return f"prefetch must be 1-65535, not {source.prefetch}"
        spec = source.setup()
        for line in spec.problems():
            key = line.partition(":")[0]
            if key == "subject" and not source.subject:
                continue  # only `onceq nats setup` needs it
            return line
        return None

    def from_table(
        self, table: dict[str, Any], where: str, base: Path, m: Mistakes
    ) -> NatsSource | None:
        stream = get(table, "stream", str, m, where, required=True)
        durable = get(table, "durable", str, m, where, required=True)
        subject = get(table, "subject", str, m, where)
        url = get(table, "url", str, m, where)
        if url is not None:
            check(m, f"{where}.url", check_url, url, "", ("nats", "tls"), "a server's port")
        prefetch = get(table, "prefetch", int, m, where, DEFAULT_PREFETCH)
        if isinstance(prefetch, int) and not 1 <= prefetch <= 65535:
            m.add(f"{where}.prefetch", f"must be 1-65535, not {prefetch}")
        raw_wait = get(table, "ack_wait", (str, int, float), m, where, DEFAULT_ACK_WAIT)
        try:
            ack_wait = parse_duration(raw_wait, "ack_wait")
        except UsageError as exc:
            m.add(f"{where}.ack_wait", str(exc).partition(": ")[2] or str(exc))
            ack_wait = DEFAULT_ACK_WAIT
        pending = get(table, "max_ack_pending", int, m, where, DEFAULT_MAX_ACK_PENDING)
        max_deliver = get(table, "max_deliver", int, m, where, -1)
        dead_subject = get(table, "dead_subject", str, m, where)
        if not stream or not durable:
            return None
        source = NatsSource(
            stream,
            durable,
            subject=subject,
            url=url,
            prefetch=prefetch,
            ack_wait=ack_wait,
            max_ack_pending=pending,
            max_deliver=max_deliver,
            dead_subject=dead_subject,
        )
        for line in source.setup().problems(lambda k: f"{where}.{k}"):
            key, _, why = line.partition(": ")
            if key == f"{where}.subject" and subject is None:
                continue
            m.add(key, why)
        return source

    def depth_reader(self, flow: Any, transport: Any) -> NatsDepths:
        return NatsDepths(transport)

    async def status_depths(
        self, flow: Any, api: str | None, now: datetime
    ) -> tuple[dict[str, Any] | None, str | None]:
        try:
            return await asyncio.wait_for(consumer_depths(flow.source), SERVER_TIMEOUT), None
        except TimeoutError:
            return None, f"the NATS server did not answer within {SERVER_TIMEOUT:.0f}s"

    def problem(self, flow: Any, transport: Any) -> str | None:
        return None if transport.connected else "NATS connection lost"

    def labelled_depths(self, queue: dict[str, Any]) -> list[dict[str, Any]]:
        return labelled(queue)

    def open(self, flow: Any, until_empty: bool) -> NatsFeed:
        return NatsFeed(flow, until_empty)

    dead_actions = frozenset({"replay", "purge"})

    async def dead_items(
        self, flow: Any, ledger: Any, selection: DeadSelection, *, bodies: bool = False
    ) -> list[DeadItem]:
        src = flow.source
        return await dead.items(nats_url(src.url), src, ledger, selection, bodies=bodies)

    async def dead_action(
        self, action: str, flow: Any, ledger: Any, selection: DeadSelection
    ) -> DeadAction:
        if action not in self.dead_actions:
            return await super().dead_action(action, flow, ledger, selection)
        # The commands' own code (ledger reset first, copy stored, then delete; audit).
        src = flow.source
        report = await dead.run(action, nats_url(src.url), src, ledger, selection)
        return DeadAction(
            action, len(report.letters), report.replayed + report.purged, op=report.op
        )

    def flag_keys(self) -> dict[str, str]:
        # nats consume --stream S --durable D --prefetch N
        return {"stream": "stream", "durable": "durable", "prefetch": "prefetch"}


NATS = NatsType()
