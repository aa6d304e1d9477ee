"""Who consumes: the consumer's registration, the drain check, the breaker's pause.

The RabbitMQ transport (`onceq._sources.amqp.transport.AmqpTransport`) mixes this in. Every
method here changes whether, and under which tag, this process is a consumer of its
queue; they run one at a time (`_control_lock`), in the order they were asked.

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
With retry tiers the queue is not drained while any tier queue holds a copy (it
comes back) or while the breaker has paused this consumer. The tiers are counted
first: a copy expiring meanwhile is already in the work queue when it is counted.

The breaker (`Pausable`): pause() cancels the consumer, and once everything
handed out is settled, basic.recover(requeue) returns what arrived for the
cancelled consumer, so nothing sits prefetched while the partner is down (other
consumers, or this one later, get it). probe() takes one message with basic.get
(asking again every PROBE_POLL_S while the queue is empty); resume() consumes
again. The three, and the drain check, run one at a time (`_control_lock`), in order.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from onceq._sources.amqp.received import received_from_get
from onceq._sources.amqp.url import CONNECT_TIMEOUT

log = logging.getLogger("onceq.amqp.transport")

# While paused, how often an empty queue is asked again for the breaker's probe.
PROBE_POLL_S = 0.5


class ConsumerControl:
    """Consuming, the drain check, pause / probe / resume (state: AmqpTransport's)."""

    # Set by AmqpTransport.__init__ / open (declared here for the type checker).
    queue_name: str
    paused: bool
    stopped: asyncio.Event
    _queue: Any
    _channel: Any
    _tag: str | None
    _active: str | None
    _consuming: bool
    _held: int
    _buffer: Any  # a deque with empty() (transport.Buffer)
    _changed: asyncio.Event
    _tier_queues: list[Any]
    _tags: Any
    _control_lock: asyncio.Lock
    _tasks: set[asyncio.Task[None]]
    _probe_task: asyncio.Task[None] | None
    _pause_task: asyncio.Task[None] | None = None  # until its recover is done (_resume)
    drain_races: int

    @property
    def connected(self) -> bool:  # pragma: no cover - AmqpTransport's
        raise NotImplementedError

    def _delivered(self, message: Any) -> Any:  # pragma: no cover - AmqpTransport's
        raise NotImplementedError

    def _seen(self, message: Any) -> None:  # pragma: no cover - AmqpTransport's
        raise NotImplementedError

    def _hand_out(self, message: Any) -> None:  # pragma: no cover - AmqpTransport's
        raise NotImplementedError

    async def _consume(self) -> None:
        # Our own tag, set before basic.consume: the first deliveries may reach
        # _on_message before consume() returns, and must be recognised as ours.
        if self.paused:  # the breaker's pause outlasts a drain check or a resume in flight
            return
        tag = f"onceq-{os.getpid()}-{next(self._tags)}"
        self._tag = self._active = tag
        await self._queue.consume(self._delivered, no_ack=False, consumer_tag=tag)
        self._consuming = True

    async def _drained(self) -> bool:
        """Is the queue drained for this consumer? Consumes again when it is not.

        See the module docstring for why each step is needed. Any broker error (an
        outage) means "not known to be drained": the run goes on and asks again.
        """
        async with self._control_lock:
            return await self._drained_now()

    async def _drained_now(self) -> bool:
        if self.stopped.is_set() or not self.connected or self.paused:
            return False  # paused: the breaker holds the queue, it is not done
        try:
            if not self._consuming:  # a check that failed half-way, or an outage
                await self._consume()
                return False
            for tier in self._tier_queues:  # a copy waiting in a tier comes back
                if (await tier.declare(timeout=CONNECT_TIMEOUT)).message_count:
                    return False
            ready = (await self._queue.declare(timeout=CONNECT_TIMEOUT)).message_count
            if ready or self._held or not self._buffer.empty():
                return False
            # From here no delivery is handed out (same step as the check above: no
            # await in between, so nothing was received meanwhile).
            tag, self._tag, self._consuming = self._active, None, False
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
            log.info(
                "drain check on %s: %s; asking again",
                self.queue_name,
                type(exc).__name__,
                extra={"event": "drain-check-failed"},
            )
        return False

    # --- the breaker's Pausable -------------------------------------------------------

    def pause(self) -> None:
        """No more deliveries until resume(); what was prefetched goes back (see top)."""
        if self.paused or self.stopped.is_set():
            return
        self.paused = True
        self._tag = None  # from now on nothing more is handed out
        self._pause_task = self._spawn(self._pause())

    def resume(self) -> None:
        """Consume again (the breaker closed)."""
        if not self.paused:
            return
        self.paused = False
        self._end_probe()
        self._spawn(self._resume())

    def probe(self) -> None:
        """While paused: hand out one more delivery (the breaker's probe)."""
        if not self.paused or self.stopped.is_set():
            return
        self._end_probe()
        self._probe_task = self._spawn(self._probe())

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _end_probe(self) -> None:
        # Not cancelled: a basic.get cancelled half-way would leave its get-ok with no
        # getter, the message unacked on the channel until it closes. The probe loop
        # sees it is no longer the probe and ends after its current get.
        self._probe_task = None

    async def _pause(self) -> None:
        # Carried through even when resume() comes meanwhile (a lost ledger answers
        # again while the copies it held still wait for their group's commit): from
        # pause() on, deliveries that arrive for the old tag are not handed out, and
        # only this recover returns them; skipped, they would sit unacked on the
        # channel until it closes. _resume waits for it.
        try:
            async with self._control_lock:
                if not self._consuming:
                    return
                self._tag, self._consuming = None, False
                await self._queue.cancel(self._active, timeout=CONNECT_TIMEOUT)
            # What was handed out is settled by the loop (released, untried); only
            # then is a recover safe: it requeues every unacked delivery of the
            # channel, and one of ours acked after it would be an unknown tag.
            while self._held and not self.stopped.is_set():
                self._changed.clear()
                await self._changed.wait()
            async with self._control_lock:
                if not self._consuming and not self._held and self.connected:
                    channel = await self._channel.get_underlay_channel()
                    await channel.basic_recover(requeue=True, timeout=CONNECT_TIMEOUT)
        except Exception as exc:  # an outage: the broker returns them when the channel dies
            log.info(
                "pause of %s: %s",
                self.queue_name,
                type(exc).__name__,
                extra={"event": "pause-failed"},
            )

    async def _resume(self) -> None:
        # Until it is a consumer again: a resume that fails (the channel is being
        # re-opened) would otherwise leave a run without --until-empty idle for good,
        # since a reconnect restores only the consumers that were registered.
        if self._pause_task is not None:  # its recover first (see _pause)
            await asyncio.gather(self._pause_task, return_exceptions=True)
        while True:
            async with self._control_lock:
                if self.paused or self._consuming or self.stopped.is_set():
                    return
                try:
                    await self._consume()
                    return
                except Exception as exc:
                    log.info(
                        "resume of %s: %s; again in 1s",
                        self.queue_name,
                        type(exc).__name__,
                        extra={"event": "resume-failed"},
                    )
            await asyncio.sleep(1.0)

    async def _probe(self) -> None:
        me = asyncio.current_task()
        while self.paused and not self.stopped.is_set() and self._probe_task is me:
            async with self._control_lock:
                message = None
                if self.connected and not self._consuming and self._probe_task is me:
                    try:
                        # On the queue's channel, as aio-pika's Queue.get; the answer is
                        # the consumer's own token (onceq._sources.amqp.received).
                        channel = await self._channel.get_underlay_channel()
                        got = await channel.basic_get(
                            self.queue_name, no_ack=False, timeout=CONNECT_TIMEOUT
                        )
                        message = received_from_get(got)
                        if message is not None:
                            self._seen(got)
                    except Exception as exc:
                        log.info(
                            "probe of %s: %s",
                            self.queue_name,
                            type(exc).__name__,
                            extra={"event": "probe-failed"},
                        )
                if message is not None:
                    self._hand_out(message)
                    return
            await asyncio.sleep(PROBE_POLL_S)  # an empty queue: a tier may refill it
