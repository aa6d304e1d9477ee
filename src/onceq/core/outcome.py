"""What decoding or handling one message came to (`Outcome`), and the two callables
that produce one: a `Decoder` (the message spec) and a `Handler` (the call effect).

Below the consume loop, the effects and the message spec alike: each of them makes
outcomes, and none of them needs the loop to do so.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from onceq.core.transport import Delivery, Kind

__all__ = ["Decoder", "Handler", "Outcome", "no_effect"]


@dataclass
class Outcome:
    """What decoding or handling one message came to."""

    kind: Kind
    reason: str = ""
    detail: str = ""
    fields: dict[str, Any] = field(default_factory=dict)
    # Seconds the partner asked us to wait (Retry-After on a 429/503, `Retry(after=…)`):
    # the retry policy picks a delay at least that long.
    retry_after: float | None = None


# A decoder reads a delivery, sets `delivery.msg_id`, and returns the fields to record
# (Outcome SUCCESS) or the reason it can never be processed (Outcome REJECTED).
Decoder = Callable[[Delivery], Outcome]
# A handler performs the business effect of a decoded message (an HTTP call), or does
# nothing when the ledger row is the effect (the directory queue).
Handler = Callable[[Delivery, dict[str, Any]], Awaitable[Outcome]]


async def no_effect(delivery: Delivery, fields: dict[str, Any]) -> Outcome:
    """Handler for queues whose effect is the ledger row itself."""
    return Outcome(Kind.SUCCESS, fields=fields)
