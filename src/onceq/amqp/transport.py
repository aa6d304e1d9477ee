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
- A delivery is handed out only if it carries our current consumer tag (chosen by
  us before basic.consume, kept by aio-pika across reconnects): one that reaches us
  for a cancelled consumer stays unacked on the channel and is returned, never
  handled half-way.

`until_empty` (a batch job: `onceq mq consume --until-empty`) ends the deliveries
once the queue is drained (whichever queue it consumes: claim.in is only the claims
preset's): nothing ready in it and nothing held by this consumer. A passive
queue.declare alone cannot say so: its count is the *ready* messages only, and a
message in flight to us (for instance one that this run has just requeued for its
retry, which the broker hands straight back) is neither ready nor received yet. So,
when this consumer holds nothing and the queue shows nothing ready, it cancels its
consumer (after cancel-ok the broker sends it nothing more), asks the broker to
requeue whatever is still unacked on the channel (basic.recover requeue=true:
exactly the deliveries that arrived after the cancel was decided and were not handed
out), and declares again: 0 ready now means drained, by construction (every method
on a channel is processed in order, so each ack and requeue of ours counts before
the declare). Otherwise it consumes again under a new tag. An idle timeout alone
would guess: a slow broker, an outage or a publisher that pauses would end the batch
early or late. Messages unacked by *other* consumers are theirs, and not waited for.
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
from onceq.errors import NotFound, redact_url
from onceq.transport import Delivery, Settle

log = logging.getLogger(__name__)

# Seconds between reconnect attempts: short, because every second without a
# connection is a second of claims not moving (aio-pika's default is 5).
RECONNECT_INTERVAL = 1.0
# --until-empty: seconds without a delivery, while holding nothing, before the queue
# is asked whether it is drained. Only latency depends on it, never the answer.
IDLE_PROBE_S = 0.2
# A header `onceq mq publish` gives each published copy: a random id of that copy.
# A delivery tag names a copy only on one channel; this names it across crashes, so
# a redelivery of a copy whose record a killed run committed (and never acked) is
# recognised as *recovered*, not counted as a re-sent duplicate. Copies from other
# publishers lack it: such a redelivery is still acked without a call, and counted
# as a duplicate.
COPY_HEADER = "x-onceq-copy"
_END = object()


class AmqpTransport:
    """Deliveries from one queue through one robust channel with prefetch `prefetch`."""

    def __init__(
        self, url: str, *, prefetch: int = 5, queue: str = QUEUE, until_empty: bool = False
    ) -> None:
        self.url = url
        self.queue_name = queue
        self.prefetch = prefetch
        self.until_empty = until_empty
        self.drained = False  # until_empty: the deliveries ended because the queue is empty
        # until_empty: drain checks that found, after the recover, a message that had
        # looked gone (in flight to us): the case a ready count alone gets wrong.
        self.drain_races = 0
        self.unsettled = 0  # settles that failed on a dead channel (the broker redelivers)
        self.stopped = asyncio.Event()
        self._buffer: asyncio.Queue[Any] = asyncio.Queue()
        self._held = 0  # received (buffered or handed out) and not yet settled
        self._changed = asyncio.Event()  # a delivery, a settle or a stop
        self._tags = itertools.count(1)
        self._consuming = False
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

        from onceq.amqp.wire import tolerate_non_utf8_shortstr

        # A message_id that is not UTF-8 would otherwise drop the connection on every
        # redelivery of that one message (see onceq.amqp.wire).
        tolerate_non_utf8_shortstr()
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
            try:
                with boundary(self.url, f"queue {self.queue_name}"):
                    # Passive: the consumer never creates topology with guessed
                    # attributes (`onceq mq topology` does, with the dead-letter ones).
                    self._queue = await self._channel.declare_queue(self.queue_name, passive=True)
            except NotFound as exc:
                # A newcomer's first run: say what declares it, not only that it is absent.
                how = "" if self.queue_name == QUEUE else f" --queue {self.queue_name}"
                raise NotFound(f"{exc}; declare it first: onceq mq topology{how}") from None
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
                await self._consume()
        except BaseException:
            await close_quietly(self._connection)
            raise

    async def _consume(self) -> None:
        # Our own tag, set before basic.consume: the first deliveries may reach
        # _on_message before consume() returns, and must be recognised as ours.
        tag = f"onceq-{os.getpid()}-{next(self._tags)}"
        self._tag = tag
        await self._queue.consume(self._on_message, no_ack=False, consumer_tag=tag)
        self._consuming = True

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
        if self.stopped.is_set() or message.consumer_tag != self._tag:
            # Not handed out: it stays unacked on the channel and goes back to the
            # queue when the channel closes (or at the drain check's basic.recover).
            return
        copy = (message.headers or {}).get(COPY_HEADER)
        stable = isinstance(copy, str) and 0 < len(copy) <= 64
        if stable:
            ref = f"{self.queue_name}/{copy}"
        else:
            ref = f"{self.queue_name}/{os.getpid()}/{next(self._seq)}"
        headers = {"message_id": message.message_id, "delivery_tag": message.delivery_tag}
        self._buffer.put_nowait(
            Delivery(
                body=message.body,
                ref=ref,
                redelivered=bool(message.redelivered),
                stable_ref=stable,
                token=message,
                headers=headers,
            )
        )
        self._held += 1
        self._changed.set()

    async def deliveries(self) -> AsyncIterator[Delivery]:
        while True:
            # Cleared before looking: a delivery, settle or stop after this line wakes
            # the wait below at once.
            self._changed.clear()
            if not self._buffer.empty():
                item = self._buffer.get_nowait()
                if item is _END:
                    return
                if _channel_closed(item.token):
                    # Its channel died before we started on it: the broker has already
                    # requeued it and will deliver it again on the new channel.
                    self._held -= 1
                    log.info("%s: skipped, its channel closed before handling", item.ref)
                    continue
                yield item
                continue
            if self.until_empty and self._held == 0:
                try:
                    await asyncio.wait_for(self._changed.wait(), IDLE_PROBE_S)
                except TimeoutError:
                    if await self._drained():
                        self.drained = True
                        return
                continue
            await self._changed.wait()

    async def _drained(self) -> bool:
        """Is the queue drained for this consumer? Consumes again when it is not.

        See the module docstring for why each step is needed. Any broker error (an
        outage) means "not known to be drained": the run goes on and asks again.
        """
        if self.stopped.is_set() or not self.connected:
            return False
        try:
            if not self._consuming:  # a check that failed half-way, or an outage
                await self._consume()
                return False
            ready = (await self._queue.declare(timeout=CONNECT_TIMEOUT)).message_count
            if ready or self._held or not self._buffer.empty():
                return False
            # From here no delivery is handed out (same step as the check above: no
            # await in between, so nothing was received meanwhile).
            tag, self._tag, self._consuming = self._tag, None, False
            await self._queue.cancel(tag, timeout=CONNECT_TIMEOUT)
            channel = await self._channel.get_underlay_channel()
            await channel.basic_recover(requeue=True, timeout=CONNECT_TIMEOUT)
            ready = (await self._queue.declare(timeout=CONNECT_TIMEOUT)).message_count
            if ready == 0:
                return True
            self.drain_races += 1
            if not self.stopped.is_set():
                await self._consume()
        except Exception as exc:
            log.info("drain check on %s: %s; asking again", self.queue_name, type(exc).__name__)
        return False

    def stop(self) -> None:
        """Stop taking deliveries (safe to call more than once, e.g. from a signal)."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        self._buffer.put_nowait(_END)
        self._changed.set()
        # Only on a live connection: while disconnected there is no consumer on the
        # broker to cancel, and the robust channel would wait for a reconnect first
        # (a SIGTERM during an outage would then take CONNECT_TIMEOUT to act).
        if self._queue is not None and self._tag is not None and self.connected:
            self._cancel_task = asyncio.get_running_loop().create_task(self._cancel(self._tag))

    async def _cancel(self, tag: str) -> None:
        try:
            await asyncio.wait_for(self._queue.cancel(tag), CONNECT_TIMEOUT)
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
                else:  # DEAD: the queue's dead-letter exchange takes it (claims: eai.dlx)
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
            finally:
                # Sent (awaited: its frame is out before any later method on this
                # channel, such as the drain check's declare) or lost with its channel:
                # either way no longer ours to settle.
                self._held -= 1
                self._changed.set()

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
