"""Moving a delivery into its retry tier: publish a confirmed copy, THEN ack the original.

    claim.in --(DELAY 5 s: copy to "" / claim.retry.5s, confirmed; ack)--> claim.retry.5s
    claim.retry.5s --(TTL 5 s expires: dead-lettered to "" / claim.in)--> claim.in

Why this order: between the confirm and the ack the message exists twice (the
original, still unacked, and the copy in its tier), never zero times. A crash
there redelivers the original and the copy comes back too: at worst one extra
attempt, which the ledger absorbs (a copy whose msg_id is already processed is
acked without a call). Acking first and publishing after would lose the message
to a crash in between.

Why a copy and not a hold: a message held unacked for a delay of minutes would
hit the broker's consumer_timeout (30 min by default), which closes the whole
channel; and it would hold a prefetch slot the whole time. A copy in a tier queue
costs nothing while it waits.

A publish that fails (returned: the tier queue is gone; nacked; its channel
closed; no confirm within the timeout) never loses the message: the original is
given back (reject requeue=True) or, with its channel gone, is already back in the
queue. The failure that led to the DELAY is recorded either way, so the next try
is the next attempt (a missing tier cannot make a message circulate forever).

The copy: the same body and properties (message_id, content_type, headers with
x-onceq-copy, …) except:
- delivery_mode 2 (persistent), whatever the original said: the copy must survive
  a broker restart as long as the original it replaces would have in a durable queue;
- no `expiration`: a per-message TTL would cut the tier's delay short;
- no `user_id`: the broker checks it against the connection's user and would close
  the channel for another publisher's;
- no x-death / x-first-death-* / x-last-death-* headers. Those belong to the
  broker: RabbitMQ 3.13.0-3.13.2 and 4.x ignore an x-death a client publishes
  (4.x keeps its own death history apart from the headers), while 3.12 and
  3.13.3+ interpret it and would count our hops as earlier deaths. Dropping them
  gives every version the same copy; the ledger, not x-death, counts attempts.
  The copy's x-death then tells the one hop the broker made (the tier expiring
  into the work queue), and a dead letter's the rest. Likewise a quorum queue's
  x-delivery-count / x-acquired-count (4.3): the copy is a new message with no
  returns of its own, whatever version reads the header.
- message_id: when the original had none (its id came from the body), the copy
  carries the decoded msg_id, because the AMQP client would otherwise give it a
  random one, which the decoder would then take as a different message's id.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from onceq._core.transport import Delivery
from onceq._sources.amqp.copy_cause import Failure, cause_of, from_result

log = logging.getLogger("onceq.amqp.retry")  # the name in every log line: kept across moves

# Seconds to wait for the broker's confirm of one copy; past it the original is
# given back (the copy may still arrive: at worst twice, never lost). A confirm takes
# milliseconds; this bound keeps a settle within a run's stop grace (timeout + 5 s).
CONFIRM_TIMEOUT = 5.0
# Headers the broker owns (its dead-lettering history): never copied, see above.
BROKER_HEADERS = ("x-death", "x-first-death-", "x-last-death-")
# A quorum queue's return counters (x-acquired-count: RabbitMQ 4.3+): never copied.
COUNTER_HEADERS = ("x-delivery-count", "x-acquired-count")


def copy_headers(headers: dict[str, Any] | None) -> dict[str, Any]:
    """The original's headers without the broker's dead-lettering and counting ones."""
    return {
        k: v
        for k, v in (headers or {}).items()
        if not (k == "x-death" or k in COUNTER_HEADERS or k.startswith(BROKER_HEADERS[1:]))
    }


def copy_properties(message: Any, msg_id: str | None) -> Any:
    """The properties of `message`'s copy (the consumer's `Received`, or an aio-pika
    IncomingMessage: the same names), as listed above."""
    from aiormq import spec

    return spec.Basic.Properties(
        app_id=message.app_id,
        content_encoding=message.content_encoding,
        content_type=message.content_type,
        correlation_id=message.correlation_id,
        delivery_mode=2,
        headers=copy_headers(message.headers),
        message_id=message.message_id or msg_id,
        message_type=message.type,
        priority=message.priority,
        reply_to=message.reply_to,
        timestamp=message.timestamp,
    )


async def publish_copy(
    delivery: Delivery, queue: str, timeout: float = CONFIRM_TIMEOUT
) -> Failure | None:
    """Publish `delivery`'s copy to `queue` (default exchange), mandatory and confirmed.

    Returns None once the broker confirmed it, else why not (onceq._sources.amqp.copy_cause:
    the caller then gives the original back instead of acking it, and says why).
    Never raises for a broker's answer.
    """
    message = delivery.token
    try:
        # The channel that delivered the original: if it is gone the broker has put the
        # original back already, and a copy now would only make a second one.
        channel = message.channel
        result = await channel.basic_publish(
            message.body,
            exchange="",
            routing_key=queue,
            properties=copy_properties(message, delivery.msg_id),
            mandatory=True,
            timeout=timeout,
        )
    except TimeoutError:
        return Failure("no-confirm", f"{timeout:g}s")
    except asyncio.CancelledError as exc:
        # aiormq cancels a publish whose channel closes under it; only a cancellation of
        # this task itself (a hard stop) is passed on. The channel's own close reason
        # (403 after revoked permissions, 404) names the cause when it has one.
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        return _closed_reason(message) or cause_of(exc)
    except Exception as exc:  # 403/404 closing the channel, nacked, returned, closed
        return cause_of(exc)
    return from_result(result)


def _closed_reason(message: Any) -> Failure | None:
    """Why the delivering channel closed, when the broker said (403, 404: a ChannelClosed)."""
    # The consumer's token says it; an aio-pika message keeps it private.
    channel = getattr(message, "raw_channel", None) or getattr(
        message, "_IncomingMessage__channel", None
    )
    closing = getattr(channel, "_closing", None)
    if isinstance(closing, asyncio.Future) and closing.done() and not closing.cancelled():
        reason = closing.exception()
        if reason is not None:
            return cause_of(reason)
    return None
