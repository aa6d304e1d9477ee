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

Who consumes (the consumer's registration, the `--until-empty` drain check
and the breaker's pause / probe / resume) is `onceq._sources.amqp.control`.

How a delivery is settled (ack, reject, a confirmed copy into a retry tier) is
`onceq._sources.amqp.settle`.

"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any

from onceq._core.retry import DEFAULT_DELAYS, delay_label
from onceq._core.transport import Delivery
from onceq._core.waits import wait
from onceq._sources.amqp.channel_watch import ChannelWatch
from onceq._sources.amqp.control import ConsumerControl
from onceq._sources.amqp.copy_header import COPY_HEADER
from onceq._sources.amqp.preflight import CTL_AFTER_S, check_consumer_timeout, check_work_queue
from onceq._sources.amqp.received import Received, consuming_connection
from onceq._sources.amqp.settle import Settling, Tags
from onceq._sources.amqp.topology import QUEUE, Topology
from onceq._sources.amqp.url import CONNECT_TIMEOUT, boundary, close_quietly
from onceq._sources.amqp.wire import install, verdict
from onceq.errors import NotFound, redact_url

log = logging.getLogger("onceq.amqp.transport")  # the name in every log line: kept across moves

# Seconds between reconnect attempts: short, because every second without a
# connection is a second of claims not moving (aio-pika's default is 5).
RECONNECT_INTERVAL = 1.0
# --until-empty: seconds without a delivery, while holding nothing, before the queue
# is asked whether it is drained (onceq._sources.amqp.control). Only latency depends on it.
IDLE_PROBE_S = 0.2
_END = object()


class AmqpTransport(ConsumerControl, Settling):
    """Deliveries from one queue through one robust channel with prefetch `prefetch`."""

    def __init__(
        self,
        url: str,
        *,
        prefetch: int = 5,
        queue: str = QUEUE,
        until_empty: bool = False,
        tiers: Sequence[tuple[float, str]] = (),
        topology: Topology | None = None,
        call_timeout: float | None = None,
    ) -> None:
        self.url = url
        self.queue_name = queue
        # (delay, retry queue) of the flow's policy (Topology.retry_queue names them).
        self.tiers = {delay_label(d): name for d, name in tiers}
        self._tier_delays = tuple(d for d, _ in tiers)
        # What the start-up check compares the work queue with (onceq._sources.amqp.preflight):
        # the flow's own names when given, else the ones derived from the queue.
        self.topology = topology or (
            Topology.claims(self._tier_delays)
            if queue == QUEUE
            else Topology.for_queue(queue, retry_delays=self._tier_delays)
        )
        self.call_timeout = call_timeout  # the flow's call timeout: consumer_timeout check
        self.queue_facts: Any = None  # what the check learned of the work queue's arguments
        self.prefetch = prefetch
        self.until_empty = until_empty
        self.drained = False  # until_empty: the deliveries ended because the queue is empty
        # until_empty: drain checks that found, after the recover, a message that had
        # looked gone (in flight to us): the case a ready count alone gets wrong.
        self.drain_races = 0
        self.unsettled = 0  # settles that failed on a dead channel (the broker redelivers)
        self.stopped = asyncio.Event()
        self._buffer = Buffer()
        # `_on_message` not overridden (a test's hold-back is): deliveries are accepted
        # in the reader's own call, looked up once here rather than per delivery.
        self._direct = type(self)._on_message is AmqpTransport._on_message
        self._held = 0  # received (buffered or handed out) and not yet settled
        self._changed = asyncio.Event()  # a delivery, a settle or a stop
        self._tags = itertools.count(1)
        self._consuming = False
        self._seq = itertools.count(1)
        self._connection: Any = None
        self._channel: Any = None
        self._watch: ChannelWatch | None = None
        self._queue: Any = None
        self._tag: str | None = None  # deliveries for this tag are handed out
        self._active: str | None = None  # the consumer registered on the broker
        self._cancel_task: asyncio.Task[None] | None = None
        self._down = False  # an outage has been reported and not yet ended
        self._tier_queues: list[Any] = []  # passively declared at open (their counts)
        self.delayed = 0  # copies published into a retry tier (then the original acked)
        self.paused = False  # the breaker paused this consumer (pause … resume)
        self._control_lock = asyncio.Lock()  # pause/resume/probe/drain: one at a time
        self._tasks: set[asyncio.Task[Any]] = set()  # background checks, awaited at close
        self._probe_task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Connect, set qos and check the queue exists; no delivery is taken yet.

        Split from `start` so the caller can open the ledger in between: a run the
        broker refuses (down, no queue) then leaves no ledger file behind.
        """
        from aio_pika.connection import make_url  # start-up time: not for `onceq --help`

        # A property or header pamqp cannot decode (a message_id or a header name that
        # is not UTF-8 …) would otherwise drop the connection on every redelivery of
        # that one message and stop the queue behind it (see onceq._sources.amqp.wire).
        install()
        # Built by hand rather than with connect_robust: when the first connect fails
        # or times out, connect_robust leaves its reconnect task running (it treats the
        # cancellation as one more failed attempt), and asyncio.run then waits for it
        # forever. Closing the connection object we hold ends that task.
        self._connection = consuming_connection()(
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
                # The policy's tiers must exist too: a DELAY into a missing one would be
                # returned, and every transient failure would then cost an attempt.
                for name in self.tiers.values():
                    with boundary(self.url, f"queue {name}"):
                        self._tier_queues.append(
                            await self._channel.declare_queue(name, passive=True)
                        )
            except NotFound as exc:
                # A newcomer's first run: say what declares it, not only that it is absent.
                raise NotFound(f"{exc}; declare it first: {self.topology_command()}") from None
            # Before anything is consumed: a work queue without onceq's dead-letter
            # arguments would drop every message onceq gives up on (Conflict, one line).
            self.queue_facts = await check_work_queue(self.url, self.topology)
        except BaseException:
            await close_quietly(self._connection)
            raise
        # Say so when the connection drops and when it is back: the run goes on by
        # itself, but an operator watching a silent consumer should know why it idles.
        self._connection.close_callbacks.add(self._on_connection_lost)
        self._connection.reconnect_callbacks.add(self._on_reconnected)
        # A channel the broker closes (403, 404) and aio-pika fails to reopen would
        # leave the run idle without a word: said, and reopened until it holds.
        self._watch = ChannelWatch(
            self._channel, self.stopped, lambda: self.connected, RECONNECT_INTERVAL
        )
        # A warning only, so it runs beside the consumer (rabbitmqctl takes ~0.5 s of CPU)
        # rather than in front of it, and only once the run has lasted CTL_AFTER_S; close()
        # cancels it (and kills rabbitmqctl) if still running.
        task = asyncio.get_running_loop().create_task(
            check_consumer_timeout(
                self.url,
                self.queue_name,
                self.call_timeout,
                self.queue_facts,
                ctl_after=CTL_AFTER_S,
            )
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def topology_command(self) -> str:
        """The `onceq mq topology` command that declares this run's queue and tiers."""
        how = "" if self.queue_name == QUEUE else f" --queue {self.queue_name}"
        if self._tier_delays and self._tier_delays != DEFAULT_DELAYS:
            how += " --retry-delays " + ",".join(delay_label(d) for d in self._tier_delays)
        if self.topology.queue_type != "classic":
            how += f" --queue-type {self.topology.queue_type}"
        return f"onceq mq topology{how}"

    async def start(self) -> None:
        """Start consuming with manual acks (after `open`)."""
        try:
            with boundary(self.url, f"queue {self.queue_name}"):
                await self._consume()
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
            extra={"event": "connection-lost"},
        )

    def _on_reconnected(self, _connection: Any) -> None:
        self._down = False
        log.warning("reconnected to %s", redact_url(self.url), extra={"event": "reconnected"})

    @property
    def connected(self) -> bool:
        c = self._connection
        return c is not None and not c.is_closed and c.connected.is_set()

    def _delivered(self, message: Any) -> Any:
        """The consumer callback: aiormq's message as the loop's token (`Received`).

        Called from the channel's reader (`received.deliver_directly`: no task per
        delivery), or by aiormq's task. Synchronous unless a subclass overrides the
        async `_on_message` (a test holding deliveries back): then its coroutine.
        """
        self._seen(message)
        if self._direct:
            self._accept(Received(message))
            return None
        return self._on_message(Received(message))

    def _seen(self, message: Any) -> None:
        """Count a delivery of the channel as unsettled (multiple acks: `Tags`)."""
        tags = self._tags_out
        if tags is None or tags.channel is not message.channel:  # a new channel
            tags = self._tags_out = Tags(message.channel)
        tags.seen(message.delivery.delivery_tag)

    async def _on_message(self, message: Received) -> None:
        self._accept(message)

    def _accept(self, message: Received) -> None:
        if self.stopped.is_set() or message.consumer_tag != self._tag:
            # Not handed out: it stays unacked on the channel and goes back to the
            # queue when the channel closes (or at the drain check's or the pause's
            # basic.recover).
            return
        self._hand_out(message)

    def _hand_out(self, message: Received) -> None:
        """Buffer a delivery for `deliveries()` (from the consumer or a probe's get)."""
        props = message.properties
        raw = message.message
        copy = props.headers.get(COPY_HEADER) if props.headers else None
        stable = isinstance(copy, str) and 0 < len(copy) <= 64
        if stable:
            ref = f"{self.queue_name}/{copy}"
        else:
            ref = f"{self.queue_name}/{os.getpid()}/{next(self._seq)}"
        delivery = raw.delivery
        headers = {"message_id": props.message_id, "delivery_tag": delivery.delivery_tag}
        self._buffer.append(
            Delivery(
                body=raw.body,
                ref=ref,
                redelivered=bool(delivery.redelivered),
                stable_ref=stable,
                token=message,
                headers=headers,
                # Malformed properties (onceq._sources.amqp.wire): dead-lettered, never tried.
                refused=verdict(props),
            )
        )
        self._held += 1
        self._changed.set()

    async def deliveries(self) -> AsyncIterator[Delivery]:
        buffer = self._buffer
        while True:
            if buffer:  # a deque's truth, not a method: once or more a delivery
                item = buffer.popleft()
                if item is _END:
                    return
                token = item.token
                # A Received's channel read directly (two Python calls less a delivery).
                if (
                    token.message.channel.is_closed
                    if token.__class__ is Received
                    else _channel_closed(token)
                ):
                    # Its channel died before we started on it: the broker has already
                    # requeued it and will deliver it again on the new channel.
                    self._held -= 1
                    log.info(
                        "%s: skipped, its channel closed before handling",
                        item.ref,
                        extra={"event": "skipped-closed-channel"},
                    )
                    continue
                yield item
                continue
            # Cleared only now, before looking at anything the wait depends on (nothing
            # can run in between: no await): a delivery, settle or stop after this line
            # wakes the wait below at once. Not per delivery: the buffer is read first.
            self._changed.clear()
            if self.until_empty and self._held == 0:
                if not await wait(self._changed, IDLE_PROBE_S) and await self._drained():
                    self.drained = True
                    return
                continue
            await self._changed.wait()

    def stop(self) -> None:
        """Stop taking deliveries (safe to call more than once, e.g. from a signal)."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        self._buffer.append(_END)
        self._changed.set()
        # Only on a live connection: while disconnected there is no consumer on the
        # broker to cancel, and the robust channel would wait for a reconnect first
        # (a SIGTERM during an outage would then take CONNECT_TIMEOUT to act).
        if self._queue is not None and self._consuming and self.connected:
            assert self._active is not None  # set with _consuming (onceq._sources.amqp.control)
            self._cancel_task = asyncio.get_running_loop().create_task(self._cancel(self._active))

    async def _cancel(self, tag: str) -> None:
        try:
            await asyncio.wait_for(self._queue.cancel(tag), CONNECT_TIMEOUT)
        except Exception as exc:  # a dead channel has no consumer left to cancel
            log.info("consumer cancel: %s", type(exc).__name__, extra={"event": "cancel-failed"})

    async def close(self) -> None:
        """Close channel and connection; anything unsettled returns to the queue."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._cancel_task is not None:
            await asyncio.gather(self._cancel_task, return_exceptions=True)
        if self._watch is not None:
            await self._watch.close()
        if self._connection is not None:
            await close_quietly(self._connection)


class Buffer(collections.deque[Any]):
    """Deliveries received and not yet handed out (read by the loop alone, so a plain
    deque: asyncio.Queue's waiters and wake-ups cost per delivery and served nobody)."""

    def empty(self) -> bool:
        return not self


def _channel_closed(message: Any) -> bool:
    try:
        message.channel  # noqa: B018 - raises when the delivering channel is closed
    except Exception:
        return True
    return False
