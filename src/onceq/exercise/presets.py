"""The two exercises as flows of the generic implementation: orders and claims.

`ORDERS` decodes a directory-queue order file exactly as 0.1.0's
`onceq.exercise.orders_0_1_0` did, and `CLAIMS` a claim delivery exactly as 0.1.0's
`onceq.exercise.claims_0_1_0.decode` (same Kind, reason and detail for every input: the
oracle test in tests/unit/test_message_spec.py feeds both arbitrary bytes).
`claims_http(base)` is 0.1.0's claim handler: POST base/v1/claims, only 201 counts,
422 is a rejection, every other status transient, no duplicate status.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from onceq.core.message import MessageSpec
from onceq.effects.http import HttpEffect, StatusMap

ORDERS_REQUIRED = ("msg_id", "order_no", "seq", "amount")
ORDERS_TYPES: Mapping[str, str] = {
    # The id named here replaces the generic id rule: 0.1.0 accepted a control
    # character in an order's msg_id (the ledger row is its effect; no header).
    "msg_id": "key",
    "order_no": "key",
    "seq": "integer",
    "amount": "number",
}
CLAIMS_PATH = "/v1/claims"
# No size limit in 0.1.0's claim decoder: RabbitMQ's own maximum (512 MiB) is the bound.
CLAIMS_MAX_BYTES = 512 * 1024 * 1024


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
CLAIMS = MessageSpec(
    id_field="guid",
    id_property=True,
    group_field="claimId",
    keep=("amount",),
    # Recorded for reports only: a claim without a usable amount is still a claim.
    types={"amount": "lenient-number"},
    max_bytes=CLAIMS_MAX_BYTES,
)


def claims_http(base_url: str, *, concurrency: int = 5, timeout: float = 10.0) -> HttpEffect:
    """0.1.0's claim call: POST BASE/v1/claims, 201 success, 422 reject, rest transient."""
    from onceq.exercise.claims_0_1_0 import check_claim_url

    return HttpEffect(
        check_claim_url(base_url) + CLAIMS_PATH,
        statuses=StatusMap(success=(201,), duplicate=(), reject=(422,), transient=()),
        timeout=timeout,
        concurrency=concurrency,
    )
