"""The directory queue's default message: an order (msg_id, order_no, seq, amount).

`dirq schema` and `dirq consume` without a flow file read order files, so the spec
lives with the source that defaults to it; `onceq._exercise.presets` names it beside
the claims preset (`ORDERS`, `OrdersSpec`) for the exercise's flows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from onceq._core.message import MessageSpec

ORDERS_REQUIRED = ("msg_id", "order_no", "seq", "amount")
ORDERS_TYPES: Mapping[str, str] = {
    # The id named here replaces the generic id rule: 0.1.0 accepted a control
    # character in an order's msg_id (the ledger row is its effect; no header).
    "msg_id": "key",
    "order_no": "key",
    "seq": "integer",
    "amount": "number",
}


def _orders_types() -> dict[str, str]:
    return dict(ORDERS_TYPES)


@dataclass(frozen=True)
class OrdersSpec(MessageSpec):
    """The orders spec as a class, so `OrdersSpec(required=…, max_bytes=…)` (what
    `dirq consume --required/--max-bytes` builds) still means an order message."""

    id_field: str | None = "msg_id"
    required: tuple[str, ...] = ORDERS_REQUIRED
    group_field: str | None = "order_no"
    seq_field: str | None = "seq"
    keep: tuple[str, ...] = ("amount",)
    types: Mapping[str, str] = field(default_factory=_orders_types)

    __hash__ = MessageSpec.__hash__  # the dataclass would make one that hashes a dict


ORDERS = OrdersSpec()
