"""What decoding or handling one message came to (`Outcome`), and the two callables
that produce one: a `Decoder` (the message spec) and a `Handler` (the call effect).

Below the consume loop, the effects and the message spec alike: each of them makes
outcomes, and none of them needs the loop to do so.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from onceq._core.transport import REJECTED, SUCCESS, Delivery, Kind
from onceq._core.values import is_utf8
from onceq.errors import redact_text

__all__ = ["Decoder", "Handler", "Outcome", "decode_safely", "no_effect"]

# The loop's own logger (the name in every log line: kept across moves): a decoder's
# failure is reported as the loop's, as it was before the boundary moved here.
log = logging.getLogger("onceq.consumer")


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
    return Outcome(SUCCESS, fields=fields)


def decode_safely(decode: Decoder, d: Delivery) -> Outcome:
    """The decoder's verdict on one delivery; never an exception.

    Whatever a decoder raises on one message's bytes (a ValueError it did not
    expect, a RecursionError, a bug) is that message's verdict, dead-lettered
    with reason internal-error, as a handler's failure is: raised here it would
    stop the run, and the message would stop every run after it (a poison loop).
    An id the ledger could not store (a lone surrogate) is refused here too, since
    every later step looks it up.
    """
    if d.refused is not None:  # the transport could not read it faithfully
        return Outcome(REJECTED, *d.refused)
    try:
        outcome = decode(d)
    except Exception as exc:
        # A bug report, not a traceback per message: one line (type and masked
        # message), the traceback at DEBUG only, as for an effect's exception.
        log.error(
            "the decoder raised %s on %s; dead-lettered as internal-error"
            " (the traceback at --log-level debug)",
            redact_text(f"{type(exc).__name__}: {exc}")[:200], d.ref,
            extra={"event": "decoder-failed", "reason": "internal-error"},
        )  # fmt: skip
        log.debug("the decoder's traceback on %s", d.ref, exc_info=exc,
                  extra={"event": "decoder-failed"})  # fmt: skip
        d.msg_id = None  # whatever it set before failing is not a checked id
        return Outcome(REJECTED, "internal-error", f"decode: {type(exc).__name__}")
    if isinstance(d.msg_id, str) and not is_utf8(d.msg_id):
        d.msg_id = None
        return Outcome(REJECTED, "encoding", "msg_id holds a lone surrogate")
    return outcome
