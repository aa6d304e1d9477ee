"""A claim delivery: the claims preset (`onceq._exercise.presets`) under its 0.1.0 names.

The decoder is `CLAIMS` (`onceq._core.message.MessageSpec` with the message_id property
first, then the body's guid); the call is `claims_http` (`onceq._effects.http`):
POST CLAIM/v1/claims, only 201 counts, 422 is a rejection, every other status,
a refused connection and a timeout are transient. One decoder and one HTTP client
serve every flow; this module only keeps the names `onceq mq` and the publisher use.
"""

from __future__ import annotations

from onceq._core.consumer import Outcome
from onceq._core.transport import Delivery
from onceq._core.values import CONTROL_CHARS
from onceq._exercise.presets import CLAIMS, CLAIMS_PATH, check_claim_url

__all__ = ["CLAIMS_PATH", "CONTROL_CHARS", "check_claim_url", "decode"]


def decode(delivery: Delivery) -> Outcome:
    """Set delivery.msg_id from the message_id property (else the body's guid)."""
    return CLAIMS.decode(delivery)
