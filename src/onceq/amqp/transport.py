"""The consume loop's Transport over RabbitMQ (aio-pika, robust connection).

Reliability choices, each for a reason:
- Manual acks only (no_ack=False): an auto-acked message is gone before the claim
  system has it, and a crash then loses it.
- basic_qos(prefetch) BEFORE basic_consume: the broker never has more than prefetch
  unacked deliveries out to us, so a slow claim system cannot make us hoard the
  queue, and other consumers get the rest. The robust channel re-applies it on
  every reconnect.
- connect_robust: a dropped connection is re-opened and the consumer re-registered
  (aio-pika restores qos, the passive queue and the consumer). What was unacked on
  the dead channel comes back from the broker marked redelivered; the ledger skips
  what was already done.
- Settling on a dead channel is logged, never raised: the broker has already put
  that delivery back, so the run goes on (ack is only sent after the ledger commit,
  so nothing is lost either way).
- stop() cancels the consumer first (no new deliveries), then the loop drains what
  it already holds; deliveries still buffered but never handed out return to the
  queue when the channel closes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any

from onceq import faults
from onceq.amqp.topology import QUEUE
from onceq.amqp.url import CONNECT_TIMEOUT, boundary, close_quietly
from onceq.errors import redact_url
from onceq.transport import Delivery, Settle

log = logging.getLogger(__name__)

# Seconds between reconnect attempts: short, because every second without a
# connection is a second of claims not moving (aio-pika's default is 5).
RECONNECT_INTERVAL = 1.0
_END = object()


class AmqpTransport:
    """Deliveries from one queue through one robust channel with prefetch `prefetch`."""

    def __init__(self, url: str, *, prefetch: int = 5, queue: str = QUEUE) -> None:
        self.url = url
        self.queue_name = queue
        self.prefetch = prefetch
        self.unsettled = 0  # settles that failed on a dead channel (the broker redelivers)
        self.stopped = asyncio.Event()
        self._buffer: asyncio.Queue[Any] = asyncio.Queue()
        self._seq = itertools.count(1)
        self._connection: Any = None
        self._channel: Any = None
        self._queue: Any = None
        self._tag: str | None = None
        self._cancel_task: asyncio.Task[None] | None = None
        self._down = False  # an outage has been reported and not yet ended

    async def open(self) -> None:
        """Connect, set qos and check the queue exists; no delivery is taken yet.

        Split from `start` so the caller can open the ledger in between: a run the
        broker refuses (down, no queue) then leaves no ledger file behind.
        """
        import aio_pika
        from aio_pika.connection import make_url

        # Built by hand rather than with connect_robust: when the first connect fails
        # or times out, connect_robust leaves its reconnect task running (it treats the
        # cancellation as one more failed attempt), and asyncio.run then waits for it
        # forever. Closing the connection object we hold ends that task.
        self._connection = aio_pika.RobustConnection(
            make_url(self.url, reconnect_interval=RECONNECT_INTERVAL),
            reconnect_interval=RECONNECT_INTERVAL,
        )
        try:
            with boundary(self.url):
                await asyncio.wait_for(
                    self._connection.connect(timeout=CONNECT_TIMEOUT), CONNECT_TIMEOUT
                )
            with boundary(self.url):
                self._channel = await self._connection.channel()
                await self._channel.set_qos(prefetch_count=self.prefetch)
            with boundary(self.url, f"queue {self.queue_name}"):
                # Passive: the consumer never creates topology with guessed attributes
                # (`onceq mq topology` does, with the dead-letter arguments).
                self._queue = await self._channel.declare_queue(self.queue_name, passive=True)
        except BaseException:
            await close_quietly(self._connection)
            raise
        # Say so when the connection drops and when it is back: the run goes on by
        # itself, but an operator watching a silent consumer should know why it idles.
        self._connection.close_callbacks.add(self._on_connection_lost)
        self._connection.reconnect_callbacks.add(self._on_reconnected)

    async def start(self) -> None:
        """Start consuming with manual acks (after `open`)."""
        try:
            with boundary(self.url, f"queue {self.queue_name}"):
                self._tag = await self._queue.consume(self._on_message, no_ack=False)
        except BaseException:
            await close_quietly(self._connection)
            raise

    def _on_connection_lost(self, _connection: Any, exc: BaseException | None = None) -> None:
        if self.stopped.is_set() or exc is None or isinstance(exc, asyncio.CancelledError):
            return  # our own close
        if self._down:
            return  # each failed reconnect attempt closes again: say it once per outage
        self._down = True
        log.warning(
            "connection to %s lost (%s); reconnecting every %gs",
            redact_url(self.url),
            type(exc).__name__,
            RECONNECT_INTERVAL,
        )

    def _on_reconnected(self, _connection: Any) -> None:
        self._down = False
        log.warning("reconnected to %s", redact_url(self.url))

    @property
    def connected(self) -> bool:
        c = self._connection
        return c is not None and not c.is_closed and c.connected.is_set()

    async def _on_message(self, message: Any) -> None:
        if self.stopped.is_set():
            return  # not handed out: it goes back to the queue when the channel closes
        ref = f"{self.queue_name}/{os.getpid()}/{next(self._seq)}"
        headers = {"message_id": message.message_id, "delivery_tag": message.delivery_tag}
        self._buffer.put_nowait(
            Delivery(
                body=message.body,
                ref=ref,
                redelivered=bool(message.redelivered),
                token=message,
                headers=headers,
            )
        )

    async def deliveries(self) -> AsyncIterator[Delivery]:
        while True:
            item = await self._buffer.get()
            if item is _END:
                return
            if _channel_closed(item.token):
                # Its channel died before we started on it: the broker has already
                # requeued it and will deliver it again on the new channel.
                log.info("%s: skipped, its channel closed before handling", item.ref)
                continue
            yield item

    def stop(self) -> None:
        """Stop taking deliveries (safe to call more than once, e.g. from a signal)."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        self._buffer.put_nowait(_END)
        # Only on a live connection: while disconnected there is no consumer on the
        # broker to cancel, and the robust channel would wait for a reconnect first
        # (a SIGTERM during an outage would then take CONNECT_TIMEOUT to act).
        if self._queue is not None and self._tag is not None and self.connected:
            self._cancel_task = asyncio.get_running_loop().create_task(self._cancel())

    async def _cancel(self) -> None:
        try:
            await asyncio.wait_for(self._queue.cancel(self._tag), CONNECT_TIMEOUT)
        except Exception as exc:  # a dead channel has no consumer left to cancel
            log.info("consumer cancel: %s", type(exc).__name__)

    async def settle(self, group: Sequence[tuple[Delivery, Settle, str]]) -> None:
        import aio_pika.exceptions as pe
        import aiormq.exceptions as ae

        for delivery, decision, _reason in group:
            message = delivery.token
            try:
                if decision is Settle.ACK:
                    await message.ack()
                elif decision is Settle.REQUEUE:
                    await message.reject(requeue=True)
                else:  # DEAD: the queue's dead-letter exchange takes it (eai.dlx)
                    await message.reject(requeue=False)
                faults.hit("mid-settle")  # acks go one by one: some of the group are sent
            except (
                ae.AMQPError,
                ae.ChannelInvalidStateError,
                pe.MessageProcessError,
                ConnectionError,
                TimeoutError,
            ) as exc:
                self.unsettled += 1
                log.warning(
                    "%s (message_id %s): could not %s, its channel is gone (%s);"
                    " the broker redelivers it and the ledger knows its outcome",
                    delivery.ref,
                    delivery.msg_id,
                    decision.value,
                    type(exc).__name__,
                )

    async def close(self) -> None:
        """Close channel and connection; anything unsettled returns to the queue."""
        if self._cancel_task is not None:
            await asyncio.gather(self._cancel_task, return_exceptions=True)
        if self._connection is not None:
            await close_quietly(self._connection)


def _channel_closed(message: Any) -> bool:
    try:
        message.channel  # noqa: B018 - aio-pika raises when the delivering channel is closed
    except Exception:
        return True
    return False
