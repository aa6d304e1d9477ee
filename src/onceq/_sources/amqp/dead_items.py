"""A RabbitMQ flow's dead letters in the console's shape.

Listing is `mq dead list`'s browse (every letter got and put back, the queue's order
kept); a replay or purge is `mq dead replay|purge`'s (`onceq._sources.amqp.dead`):
the ledger reset and audit row first, the copy published persistent, mandatory and
confirmed, only then the dead letter acked. A letter is selected by its msg_id; the
selection is matched against the queue as it is when the action runs, so a letter
already replayed is not there to be replayed again. A letter without a msg_id cannot
be selected one by one (only by its reason).

Header values are never shown (a sender's header may carry a credential): the
properties list the header names, and the broker's own x-death entries decoded.
"""

from __future__ import annotations

from typing import Any

from onceq._core.values import text
from onceq._sources.amqp.dead import browse, purge, replay
from onceq._sources.amqp.dead_letter import DeadLetter, Selection
from onceq._sources.amqp.topology import Topology
from onceq._sources.amqp.url import amqp_url
from onceq._sources.dead_api import DeadAction, DeadItem, DeadSelection

__all__ = ["action", "items"]

MASKED = "***"


def _where(flow: Any) -> tuple[str, Topology, str | None]:
    return (
        amqp_url(flow.source.url),
        Topology.for_source(flow.source).check(),
        flow.message.id_field,
    )


def _selection(selection: DeadSelection) -> Selection:
    return Selection(all=not selection.keys and selection.reason is None,
                     ids=selection.keys, reason=selection.reason)  # fmt: skip


async def items(
    flow: Any, ledger: Any, selection: DeadSelection, *, bodies: bool = False
) -> list[DeadItem]:
    url, topology, id_field = _where(flow)
    report = await browse(
        url, topology, ledger, _selection(selection), id_field=id_field, bodies=bodies
    )
    dlq = topology.dead_letter_queue
    return [_item(x, dlq, bodies) for x in report.matched]


async def action(name: str, flow: Any, ledger: Any, selection: DeadSelection) -> DeadAction:
    url, topology, id_field = _where(flow)
    sel = _selection(selection)
    if name == "replay":
        report = await replay(url, topology, ledger, sel, id_field=id_field)
    else:
        report = await purge(url, topology, ledger, sel, id_field=id_field)
    return DeadAction(
        name,
        matched=len(report.matched),
        done=len(report.done),
        skipped=[(text(x.msg_id) or "?", why) for x, why in report.skipped],
        op=report.op,
    )


def _item(x: DeadLetter, dlq: str, bodies: bool) -> DeadItem:
    when = x.dead_at
    props = x.properties
    headers = props.headers if props is not None and isinstance(props.headers, dict) else {}
    shown: dict[str, Any] = {
        "message_id": text(getattr(props, "message_id", None)),
        "content_type": text(getattr(props, "content_type", None)),
        "delivery_mode": getattr(props, "delivery_mode", None),
        "headers": {text(k): MASKED for k in headers if k != "x-death"},
        "x_death": [d.as_dict() for d in x.deaths],
        "position": x.position,
    }
    return DeadItem(
        key=text(x.msg_id) or "",
        msg_id=text(x.msg_id),
        reason=x.reason,
        detail=x.detail,
        attempts=x.attempts,
        died_at=when.isoformat() if when else None,
        size=x.size,
        where=dlq,
        body=x.body if bodies else None,
        properties=shown,
    )
