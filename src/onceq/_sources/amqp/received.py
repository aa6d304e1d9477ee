"""A delivery as the consumer holds it (`Received`), and the robust queue that makes one.

aio-pika wraps every delivery in an `IncomingMessage` (about thirty attribute writes,
each through a checking `__setattr__`) and starts one more asyncio task to call the
consumer with it, on top of the task aiormq already starts per delivery. The consumer
reads a handful of those attributes once, so on its hot path that was most of what
the client library cost per message (measured with callgrind: see the commit that
brought this module). Here:

- `consuming_connection()` is aio-pika's `RobustConnection` whose channels make
  `_DirectQueue`s: a robust queue (restored after a reconnect with its consumers, as
  before) whose consumer callback receives aiormq's `DeliveredMessage` itself, in
  aiormq's task, with no second task and no wrapper;
- `deliver_directly` then hands those deliveries to the consumer from the channel's
  frame reader itself: aiormq starts a task per delivery to call a consumer (a task,
  its wrapper, two done-callbacks and a coroutine frame), the loop needs none;
- `Received` is the token the loop carries: the same attribute names as aio-pika's
  `IncomingMessage` (message_id, headers, channel, delivery_tag, …) read lazily from
  the frame pamqp decoded, and `ack` / `reject`, sent on the channel that delivered it.

Its `channel` raises on a closed channel, as aio-pika's does: the loop skips a copy
whose channel died before it was started (the broker has requeued it already).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

__all__ = ["Received", "consuming_connection", "deliver_directly", "received_from_get"]


class Received:
    """One delivery: aiormq's message and its properties, read where needed."""

    __slots__ = ("message", "properties")

    def __init__(self, message: Any) -> None:
        self.message = message  # aiormq's DeliveredMessage
        self.properties = message.header.properties  # pamqp's Basic.Properties

    # --- the delivery ---------------------------------------------------------------

    @property
    def body(self) -> bytes:
        body: bytes = self.message.body
        return body

    @property
    def raw_channel(self) -> Any:
        """The aiormq channel that delivered it, open or not."""
        return self.message.channel

    @property
    def channel(self) -> Any:
        """The delivering channel; ChannelInvalidStateError once it is closed."""
        channel = self.message.channel
        if channel.is_closed:
            from aiormq.exceptions import ChannelInvalidStateError

            raise ChannelInvalidStateError
        return channel

    @property
    def delivery_tag(self) -> int | None:
        tag: int | None = self.message.delivery.delivery_tag
        return tag

    @property
    def redelivered(self) -> bool:
        return bool(self.message.delivery.redelivered)

    @property
    def consumer_tag(self) -> str | None:
        return getattr(self.message.delivery, "consumer_tag", None)

    @property
    def routing_key(self) -> str | None:
        key: str | None = self.message.routing_key
        return key

    @property
    def exchange(self) -> str | None:
        name: str | None = self.message.exchange
        return name

    # --- its properties (aio-pika's names: `type` is AMQP's and pamqp's message_type) --

    @property
    def message_id(self) -> str | None:
        value: str | None = self.properties.message_id
        return value

    @property
    def headers(self) -> dict[str, Any]:
        value: dict[str, Any] | None = self.properties.headers
        return value if value is not None else {}

    @property
    def type(self) -> str | None:
        value: str | None = self.properties.message_type
        return value

    def __getattr__(self, name: str) -> Any:
        # content_type, content_encoding, correlation_id, reply_to, priority, timestamp,
        # app_id, user_id, expiration, delivery_mode, cluster_id: pamqp's own names.
        if name.startswith("_") or name in Received.__slots__:
            raise AttributeError(name)
        return getattr(self.properties, name)

    # --- settling ---------------------------------------------------------------------

    async def ack(self, multiple: bool = False) -> None:
        await self.channel.basic_ack(self.message.delivery.delivery_tag, multiple=multiple)

    async def reject(self, requeue: bool = False) -> None:
        await self.channel.basic_reject(self.message.delivery.delivery_tag, requeue=requeue)

    def __repr__(self) -> str:
        return f"<Received tag={self.delivery_tag} message_id={self.message_id!r}>"


def received_from_get(message: Any) -> Received | None:
    """A basic.get's answer as a `Received`; None for GetEmpty (an empty queue)."""
    from aiormq import spec

    if isinstance(message.delivery, spec.Basic.GetEmpty):
        return None
    return Received(message)


@functools.cache
def consuming_connection() -> type[Any]:
    """aio-pika's RobustConnection whose queues hand the consumer aiormq's message.

    Built on first use: `onceq --help` and every command that does not consume never
    load aio-pika (start-up time).
    """
    from aio_pika import RobustChannel, RobustConnection, RobustQueue

    class _DirectQueue(RobustQueue):
        """A robust queue whose consumer gets aiormq's DeliveredMessage, from its reader.

        RobustQueue.consume with Queue.consume's body, minus its wrapper (a task and an
        IncomingMessage per delivery); the consumer is recorded as RobustQueue records
        it, so a reconnect restores it through this same method.
        """

        async def consume(
            self,
            callback: Any,
            no_ack: bool = False,
            exclusive: bool = False,
            arguments: Any = None,
            consumer_tag: Any = None,
            timeout: Any = None,
            robust: bool = True,
        ) -> Any:
            channel = await self.channel.get_underlay_channel()
            if consumer_tag is not None:
                # Before basic.consume, so that its very first delivery comes the same
                # way as the rest: a delivery aiormq's task hands over later than the
                # next one taken directly would reach `Tags` out of order, read as a
                # delivery never seen, and no multiple ack would reach past it again.
                deliver_directly(channel, consumer_tag, callback)
            result = await channel.basic_consume(
                queue=self.name,
                consumer_callback=callback,
                exclusive=exclusive,
                no_ack=no_ack,
                arguments=arguments,
                consumer_tag=consumer_tag,
                timeout=timeout,
            )
            tag = result.consumer_tag
            if tag is None:  # as aio-pika: pamqp never answers without one
                raise RuntimeError("Consumer tag is None")
            if consumer_tag is None:  # ours always names its tag (control._consume)
                deliver_directly(channel, tag, callback)
            if robust:
                self._consumers[tag] = {
                    "callback": callback,
                    "no_ack": no_ack,
                    "exclusive": exclusive,
                    "arguments": arguments,
                }
            return tag

    class _Channel(RobustChannel):
        QUEUE_CLASS = _DirectQueue

    class _Connection(RobustConnection):
        CHANNEL_CLASS = _Channel

    return _Connection


# What `deliver_directly` needs of aiormq's Channel: its reader awaits
# `self._on_deliver_frame(frame)` for every basic.deliver, and then reads the content
# header and body with `_get_frame` and `_read_content` (aiormq 6 and 7). No public
# aiormq API calls a consumer without a task.
_CHANNEL_PARTS = ("_on_deliver_frame", "_get_frame", "_read_content", "_on_consumer_done")


def deliver_directly(channel: Any, tag: str, callback: Any) -> bool:
    """Call `callback(message)` for `tag`'s deliveries on `channel` from its frame reader.

    aiormq's reader starts one task per delivery to await the consumer callback; a
    callback that only buffers the message (AmqpTransport's) needs no task, and that
    task was the biggest client-library cost left per message (callgrind, 3,000
    deliveries: see the commit that brought this). The callback is still registered with
    aiormq as usual (basic_consume), so anything this cannot take over — another
    consumer tag, a cancelled consumer, an aiormq whose channel lacks these parts
    (False) — goes aiormq's own way, unchanged. A callback that returns an awaitable (a
    subclass's async override) gets the task aiormq would have given it; one that
    raises is logged as aiormq logs it, never raised into the reader (that would close
    the channel and requeue its whole prefetch window).
    """
    if not all(hasattr(type(channel), name) for name in _CHANNEL_PARTS):
        return False
    hooks: dict[str, Any] | None = channel.__dict__.get("_onceq_direct")
    if hooks is None:
        from pamqp.header import ContentHeader

        hooks = channel._onceq_direct = {}
        aiormqs = channel._on_deliver_frame  # bound: aiormq's own path

        async def on_deliver_frame(frame: Any) -> None:
            consumer_tag = frame.consumer_tag
            direct = hooks.get(consumer_tag)
            if direct is None or consumer_tag not in channel.consumers:
                # Not ours, or cancelled (aiormq reads it and drops it: it stays
                # unacked until the channel closes or is recovered).
                await aiormqs(frame)
                return
            header = await channel._get_frame()
            if not isinstance(header, ContentHeader):
                raise ValueError(f"Unexpected frame {header!r} instead of ContentHeader", header)
            message = await channel._read_content(frame, header)
            try:
                result = direct(message)
            except Exception:
                # What aiormq does with a consumer task that raised: the same line, on
                # its channel module's logger (as before this path existed).
                aiormq_log = logging.getLogger(type(channel).__module__)
                aiormq_log.error("Consumer callback failed", exc_info=True)
                return
            if result is not None:
                task = channel.create_task(result)
                task.add_done_callback(channel._on_consumer_done)

        # An instance attribute: looked up before the class's method by the reader.
        channel._on_deliver_frame = on_deliver_frame
    # Tags cancelled since (a drain check consumes again under a new tag): forgotten.
    for old in [t for t in hooks if t not in channel.consumers]:
        del hooks[old]
    hooks[tag] = callback
    return True
