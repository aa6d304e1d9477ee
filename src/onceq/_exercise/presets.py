"""The two exercises as flows of the generic implementation: orders and claims.

`ORDERS` (the directory queue's default, from onceq._sources.dirq.orders) decodes an
order file exactly as 0.1.0's `onceq._exercise.orders_0_1_0` did, and `CLAIMS` a claim
delivery exactly as 0.1.0's `onceq._exercise.claims_0_1_0.decode` (same Kind, reason
and detail for every input: the oracle test in tests/unit/test_message_spec.py feeds
both arbitrary bytes). `claims_http(base)` is 0.1.0's claim handler: POST
base/v1/claims, only 201 counts, 422 is a rejection, every other status transient,
no duplicate status.
"""

from __future__ import annotations

from onceq._core.message import MessageSpec
from onceq._core.url_check import check_url
from onceq._effects.http import HttpEffect, StatusMap

# The orders spec is the directory queue's default message: it lives with that source.
from onceq._sources.dirq.orders import ORDERS, ORDERS_REQUIRED, ORDERS_TYPES, OrdersSpec

__all__ = [
    "CLAIMS",
    "CLAIMS_MAX_BYTES",
    "CLAIMS_PATH",
    "ORDERS",
    "ORDERS_REQUIRED",
    "ORDERS_TYPES",
    "OrdersSpec",
    "check_claim_url",
    "claims_http",
]

CLAIMS_PATH = "/v1/claims"
# No size limit in 0.1.0's claim decoder: RabbitMQ's own maximum (512 MiB) is the bound.
CLAIMS_MAX_BYTES = 512 * 1024 * 1024


CLAIMS = MessageSpec(
    id_field="guid",
    id_property=True,
    group_field="claimId",
    keep=("amount",),
    # Recorded for reports only: a claim without a usable amount is still a claim.
    types={"amount": "lenient-number"},
    max_bytes=CLAIMS_MAX_BYTES,
)


def check_claim_url(url: str) -> str:
    """The claim system's base URL, without a trailing slash; UsageError if unusable."""
    return check_url(url, "--claim ", ("http", "https"), "a claim system's port").rstrip("/")


def claims_http(base_url: str, *, concurrency: int = 5, timeout: float = 10.0) -> HttpEffect:
    """0.1.0's claim call: POST BASE/v1/claims, 201 success, 422 reject, rest transient."""
    return HttpEffect(
        check_claim_url(base_url) + CLAIMS_PATH,
        statuses=StatusMap(success=(201,), duplicate=(), reject=(422,), transient=()),
        timeout=timeout,
        concurrency=concurrency,
    )
