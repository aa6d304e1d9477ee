"""Why a copy onceq publishes (a retry tier's copy) was not confirmed: one cause, its words.

A copy for a retry queue that the broker does not confirm is given back to the work
queue (onceq._sources.amqp.retry); the warning then says why, from what the broker actually
answered — not one guess. Only a missing queue is fixed by declaring the tiers;
revoked permissions, a closed channel or a nack are not.

    cause_of(exc_or_result) -> Failure(cause, detail)   # from publish_copy
    words(failure, queue=…, fix=…) -> "…"               # the warning's reason
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

__all__ = ["CAUSES", "Failure", "cause_of", "words"]

# cause -> what the warning says (queue: the copy's queue; fix: the topology command).
CAUSES: dict[str, str] = {
    "access-refused": (
        "the broker refused it: ACCESS_REFUSED (403), the user may not publish in this"
        " vhost (its permissions were changed or revoked: rabbitmqctl list_permissions)"
    ),
    "not-found": "the queue {queue} does not exist (NOT_FOUND 404); declare the tiers: {fix}",
    "returned": "the broker returned it unroutable: no queue {queue}; declare the tiers: {fix}",
    "channel-closed": "its channel or connection closed before the broker confirmed it{detail}",
    "nacked": "the broker nacked it (it did not take the copy{detail})",
    "no-confirm": "no confirm from the broker within {detail}",
    "no-tier": "no retry queue for this delay (a policy the consumer was not opened with)",
}


@dataclass(frozen=True)
class Failure:
    """A copy not confirmed: `cause` (a CAUSES key) and the broker's own detail."""

    cause: str
    detail: str = ""

    def __str__(self) -> str:
        return self.cause if not self.detail else f"{self.cause}: {self.detail}"


def cause_of(exc: BaseException) -> Failure:
    """The cause of an exception raised by a confirmed publish (aiormq/aio-pika)."""
    import aiormq.exceptions as ae

    detail = _reply(exc)
    if isinstance(exc, ae.ChannelAccessRefused):
        return Failure("access-refused", detail)
    if isinstance(exc, ae.ChannelNotFoundEntity):
        return Failure("not-found", detail)
    if isinstance(exc, ae.PublishError):  # mandatory and returned: nowhere to route it
        return Failure("returned", detail)
    if isinstance(exc, ae.DeliveryError):  # basic.nack
        return Failure("nacked", detail)
    if isinstance(exc, TimeoutError):
        return Failure("no-confirm", detail)
    if isinstance(
        exc,
        ae.ChannelClosed
        | ae.ChannelInvalidStateError
        | ae.ConnectionClosed
        | ConnectionError
        | asyncio.CancelledError
        | RuntimeError,
    ):
        return Failure("channel-closed", detail or type(exc).__name__)
    return Failure("channel-closed", type(exc).__name__)


def _reply(exc: BaseException) -> str:
    """The broker's reply text (e.g. "ACCESS_REFUSED - access to …"), if it gave one.

    aiormq builds a 403/404 as `ChannelAccessRefused(reply_text)` and any other close
    as `ChannelClosed(reply_code, reply_text)`.
    """
    args: tuple[object, ...] = getattr(exc, "args", ())
    if len(args) == 1 and isinstance(args[0], str):
        return args[0]
    if len(args) >= 2 and isinstance(args[1], str):
        return args[1]
    return ""


def words(failure: Failure, *, queue: str, fix: str) -> str:
    """The warning's reason for `failure`: one table, every cause its own words."""
    detail = failure.detail
    if failure.cause in ("channel-closed", "nacked") and detail:
        detail = f": {detail}"
    return CAUSES[failure.cause].format(queue=queue, fix=fix, detail=detail)


def from_result(result: Any) -> Failure | None:
    """A publish's result: None when confirmed, else why not (returned, nacked)."""
    from aiormq import spec

    if isinstance(result, spec.Basic.Ack):
        return None
    if isinstance(result, spec.Basic.Nack):
        return Failure("nacked")
    # A returned message (mandatory, no such queue) comes back as the message itself.
    return Failure("returned") if result is not None else Failure("nacked", "no answer")
