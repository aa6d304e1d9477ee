"""Settling the RabbitMQ transport's deliveries (AmqpTransport mixes this in).

ACK = ack; REQUEUE and RELEASE = reject(requeue=True) (RELEASE: never tried, the
breaker is open); DEAD = reject(requeue=False) to the dead-letter exchange; DELAY =
a confirmed copy into the tier queue of that delay, then the ack
(onceq._sources.amqp.retry: why that order, and what a failed publish does).
Why a settle on a dead channel is logged, never raised: onceq._sources.amqp.transport.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Iterable, Sequence
from typing import Any

from onceq._core import faults
from onceq._core.retry import delay_label
from onceq._core.transport import ACK, DEAD, DELAY, REQUEUE, SETTLE_VERBS, Delivery, Settle
from onceq._sources.amqp.copy_cause import Failure, words
from onceq._sources.amqp.received import Received
from onceq._sources.amqp.retry import publish_copy

log = logging.getLogger("onceq.amqp.transport")  # the name in every log line: kept across moves


class Settling:
    """settle(): acks, rejects and retry copies (state: AmqpTransport's)."""

    # Set by AmqpTransport.__init__ (declared here for the type checker).
    queue_name: str
    tiers: dict[str, str]
    delayed: int
    unsettled: int
    _held: int
    _changed: asyncio.Event
    _tags_out: Tags | None = None  # the consuming channel's unsettled tags

    def topology_command(self) -> str:  # pragma: no cover - AmqpTransport's
        raise NotImplementedError

    async def settle(self, group: Sequence[tuple[Delivery, Settle, str]]) -> None:
        # DELAY: every copy of the group is published (confirms awaited together), and
        # only then is any original acked: never acked before its copy is confirmed.
        delays = [d for d, decision, _ in group if decision is DELAY]
        failed: dict[int, Failure] = {}
        if delays:
            results = await asyncio.gather(*(self._publish_copy(d) for d in delays))
            failed = {id(d): why for d, why in zip(delays, results, strict=True) if why}
            self.delayed += len(delays) - len(failed)
            faults.hit("after-delay-publish")  # copies confirmed, originals not yet acked
        acks: list[tuple[Delivery, Settle]] = []
        for delivery, decision, _reason in group:
            why = failed.get(id(delivery))
            if decision is ACK or (decision is DELAY and why is None):
                acks.append((delivery, decision))
            else:
                await self._settle_one(delivery, decision, why)
        if len(acks) > 1:
            acks = await self._ack_together(acks)
        for delivery, decision in acks:
            await self._settle_one(delivery, decision, None)

    async def _ack_together(
        self, acks: list[tuple[Delivery, Settle]]
    ) -> list[tuple[Delivery, Settle]]:
        """One `multiple` ack for the group's acks that it may cover; the rest returned.

        A multiple ack at tag T acks every delivery of the channel up to T, so it may
        only cover tags below every delivery of that channel still unsettled outside
        this group (handed out or not: one received for a cancelled consumer waits
        for its recover) and below any tag this channel delivered that we never saw
        (`Tags`). The rest are acked one by one, as before.
        """
        tags = self._tags_out
        if tags is None:
            return acks
        mine: dict[int, tuple[Delivery, Settle]] = {}
        for delivery, decision in acks:
            token = delivery.token
            if isinstance(token, Received) and token.message.channel is tags.channel:
                mine[token.message.delivery.delivery_tag] = (delivery, decision)
        limit = tags.limit(mine.keys())
        covered = [t for t in mine if t < limit]
        if len(covered) < 2:
            return acks
        top = max(covered)
        covering = [mine[t] for t in covered]
        try:
            await mine[top][0].token.ack(multiple=True)
            faults.hit("mid-settle")
        except _lost_settle() as exc:
            self.unsettled += len(covering)
            for delivery, decision in covering:
                _lost(delivery, decision, None, exc)
        finally:
            for t in covered:
                tags.settled(t)
            self._held -= len(covering)
            self._changed.set()
        done = {id(d) for d, _ in covering}
        return [(d, decision) for d, decision in acks if id(d) not in done]

    async def _publish_copy(self, delivery: Delivery) -> Failure | None:
        queue = self.tiers.get(delay_label(delivery.delay))
        if queue is None:  # a policy the transport was not opened with: a bug, not data
            return Failure("no-tier")
        return await publish_copy(delivery, queue)

    async def _settle_one(
        self, delivery: Delivery, decision: Settle, failed: Failure | None
    ) -> None:
        message = delivery.token
        try:
            if decision is ACK or (decision is DELAY and failed is None):
                await message.ack()
            elif decision is DEAD:
                # The queue's dead-letter exchange takes it (claims: eai.dlx).
                await message.reject(requeue=False)
            else:  # REQUEUE, RELEASE (untried), or a DELAY whose copy was not confirmed
                if failed is not None:
                    tier = self.tiers.get(delay_label(delivery.delay), "?")
                    log.warning(
                        "%s (message_id %s): its copy for the %gs retry queue %s was not"
                        " confirmed: %s; given back to %s instead",
                        delivery.ref,
                        delivery.msg_id,
                        delivery.delay,
                        tier,
                        words(failed, queue=tier, fix=self.topology_command()),
                        self.queue_name,
                        extra={
                            "event": "retry-copy-unconfirmed",
                            "msg_id": delivery.msg_id,
                            "cause": failed.cause,
                        },
                    )
                await message.reject(requeue=True)
            faults.hit("mid-settle")  # acks go one by one: some of the group are sent
        except _lost_settle() as exc:
            self.unsettled += 1
            _lost(delivery, decision, failed, exc)
        finally:
            # Sent (awaited: its frame is out before any later method on this
            # channel, such as the drain check's declare) or lost with its channel:
            # either way no longer ours to settle.
            tags = self._tags_out
            if (
                tags is not None
                and isinstance(message, Received)
                and message.message.channel is tags.channel
            ):
                tags.settled(message.message.delivery.delivery_tag)
            self._held -= 1
            self._changed.set()


@functools.cache
def _lost_settle() -> tuple[type[Exception], ...]:
    """What a settle on a gone channel raises (imported at the first failure only:
    start-up time, and no import statement per settle)."""
    import aio_pika.exceptions as pe
    import aiormq.exceptions as ae

    return (
        ae.AMQPError,
        ae.ChannelInvalidStateError,
        pe.MessageProcessError,
        ConnectionError,
        TimeoutError,
    )


def _lost(delivery: Delivery, decision: Settle, failed: Failure | None, exc: Exception) -> None:
    log.warning(
        "%s (message_id %s): could not %s, its channel is gone (%s);"
        " the broker redelivers it and the ledger knows its outcome",
        delivery.ref,
        delivery.msg_id,
        # A DELAY whose copy was not confirmed was a requeue.
        SETTLE_VERBS[REQUEUE if decision is DELAY and failed else decision],
        type(exc).__name__,
        extra={"event": "settle-lost", "msg_id": delivery.msg_id},
    )


class Tags:
    """The delivery tags of one channel that are still unsettled, for multiple acks.

    `seen` is called for every delivery the channel hands us (consumed or got), in
    tag order, whether it is handed out or not. The broker numbers a channel's
    deliveries 1, 2, 3 …: a tag that skips one means a delivery we never saw (one
    aiormq dropped for a consumer tag no longer registered), which may still be
    unacked, so no multiple ack ever reaches past it.
    """

    __slots__ = ("channel", "gap", "last", "out")

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.out: set[int] = set()
        self.last = 0
        self.gap: int | None = None  # the first tag this channel delivered unseen

    def seen(self, tag: int) -> None:
        if tag != self.last + 1 and self.gap is None:
            self.gap = self.last + 1
        if tag > self.last:
            self.last = tag
        self.out.add(tag)

    def settled(self, tag: int) -> None:
        self.out.discard(tag)

    def limit(self, acking: Iterable[int]) -> float:
        """Tags below this may be acked together with `acking` (one multiple ack)."""
        blocked = self.out.difference(acking)
        low = min(blocked) if blocked else math.inf
        return low if self.gap is None else min(low, self.gap)
