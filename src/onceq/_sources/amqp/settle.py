"""Settling the RabbitMQ transport's deliveries (AmqpTransport mixes this in).

ACK = ack; REQUEUE and RELEASE = reject(requeue=True) (RELEASE: never tried, the
breaker is open); DEAD = reject(requeue=False) to the dead-letter exchange; DELAY =
a confirmed copy into the tier queue of that delay, then the ack
(onceq._sources.amqp.retry: why that order, and what a failed publish does).
Why a settle on a dead channel is logged, never raised: onceq._sources.amqp.transport.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from onceq._core import faults
from onceq._core.retry import delay_label
from onceq._core.transport import SETTLE_VERBS, Delivery, Settle
from onceq._sources.amqp.copy_cause import Failure, words
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

    def topology_command(self) -> str:  # pragma: no cover - AmqpTransport's
        raise NotImplementedError

    async def settle(self, group: Sequence[tuple[Delivery, Settle, str]]) -> None:
        # DELAY: every copy of the group is published (confirms awaited together), and
        # only then is any original acked: never acked before its copy is confirmed.
        delays = [d for d, decision, _ in group if decision is Settle.DELAY]
        failed: dict[int, Failure] = {}
        if delays:
            results = await asyncio.gather(*(self._publish_copy(d) for d in delays))
            failed = {id(d): why for d, why in zip(delays, results, strict=True) if why}
            self.delayed += len(delays) - len(failed)
            faults.hit("after-delay-publish")  # copies confirmed, originals not yet acked
        for delivery, decision, _reason in group:
            await self._settle_one(delivery, decision, failed.get(id(delivery)))

    async def _publish_copy(self, delivery: Delivery) -> Failure | None:
        queue = self.tiers.get(delay_label(delivery.delay))
        if queue is None:  # a policy the transport was not opened with: a bug, not data
            return Failure("no-tier")
        return await publish_copy(delivery, queue)

    async def _settle_one(
        self, delivery: Delivery, decision: Settle, failed: Failure | None
    ) -> None:
        import aio_pika.exceptions as pe  # start-up time: aio-pika only once consuming
        import aiormq.exceptions as ae

        message = delivery.token
        try:
            if decision is Settle.ACK or (decision is Settle.DELAY and failed is None):
                await message.ack()
            elif decision is Settle.DEAD:
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
                # A DELAY whose copy was not confirmed was a requeue.
                SETTLE_VERBS[Settle.REQUEUE if decision is Settle.DELAY and failed else decision],
                type(exc).__name__,
                extra={"event": "settle-lost", "msg_id": delivery.msg_id},
            )
        finally:
            # Sent (awaited: its frame is out before any later method on this
            # channel, such as the drain check's declare) or lost with its channel:
            # either way no longer ours to settle.
            self._held -= 1
            self._changed.set()
