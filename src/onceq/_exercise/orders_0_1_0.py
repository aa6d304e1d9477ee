"""The directory queue's message: the orders preset of `onceq._core.message.MessageSpec`.

One decoder serves every flow (`onceq._core.message`); this module keeps the names the
directory queue's callers of 0.1.0 use. `MessageSpec()` here is the orders spec
(`onceq._exercise.presets.OrdersSpec`), so `MessageSpec(required=…, max_bytes=…)` still
means an order message with other required fields.

Every reason a file is not a message is permanent (the same bytes fail the same way
on every try), so it is quarantined at once instead of blocking the queue: the
table of reasons is in `onceq._core.message`.
"""

from __future__ import annotations

from typing import Any

from onceq._core.consumer import Outcome
from onceq._core.message import DEFAULT_MAX_BYTES
from onceq._core.message import MessageSpec as GenericSpec
from onceq._core.transport import Delivery
from onceq._exercise.presets import ORDERS, ORDERS_REQUIRED
from onceq._exercise.presets import OrdersSpec as MessageSpec

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_REQUIRED",
    "REASONS",
    "MessageSpec",
    "decode",
    "parse_document",
]

DEFAULT_REQUIRED = ORDERS_REQUIRED
REASONS = (
    "not-a-file",
    "unreadable",
    "too-large",
    "empty",
    "encoding",
    "parse",
    "not-object",
    "missing-field",
    "bad-type",
)


def parse_document(body: bytes, spec: GenericSpec = ORDERS) -> dict[str, Any] | Outcome:
    """The JSON object in body, or the rejection that says why there is none."""
    return spec.parse_document(body)


def decode(delivery: Delivery, spec: GenericSpec = ORDERS) -> Outcome:
    """Decode a file's bytes into the fields to record, setting `delivery.msg_id`."""
    return spec.decode(delivery)
