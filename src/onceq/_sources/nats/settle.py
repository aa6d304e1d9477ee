"""Settling the NATS transport's copies (NatsTransport mixes this in).

    ACK      ack
    REQUEUE  NAK: redelivered at once (an immediate retry)
    RELEASE  NAK: never tried (the breaker is open), given back at once
    DELAY    NAK with the tier's delay: the server redelivers it after that long; no
             extra stream is needed, and nothing is held by this process meanwhile
    DEAD     a copy published to the flow's dead-letter subject, its PubAck awaited,
             THEN the original acked

Why that order for DEAD: between the PubAck and the ack the message exists twice (the
original, still unacked, and its dead letter), never zero times. A crash there
redelivers the original: the dead copy carries Nats-Msg-Id STREAM:SEQ (the original's
stream sequence), so the server drops a second dead copy of the same stored message
inside its duplicate window. Acking first would lose the message to a crash in
between. Why an ack and not a TERM: on a work-queue stream an ack removes the
message; a TERM (nats-server 2.9) leaves it stored for ever, in no one's hands.

A dead letter that cannot be published (no stream takes the subject, no PubAck in
time) is NAKed with a short delay instead: never lost, tried again soon (its failure
is recorded, so the next try is the next attempt) and not in a hot loop.

An ack or NAK is a publish on the connection, not a request: one sent while the
connection is down is lost, and the server redelivers that copy after AckWait; the
ledger knows its outcome. So a settle never raises for the connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from onceq._core import faults
from onceq._core.transport import SETTLE_VERBS, Delivery, Settle

log = logging.getLogger("onceq.nats.transport")

# Seconds to wait for a dead letter's PubAck; past it the original is NAKed instead.
PUBACK_TIMEOUT = 5.0
# Seconds a copy whose dead letter was not stored waits before it is tried again.
DEAD_RETRY_DELAY = 5.0
# Headers a dead letter carries besides the original's.
REASON = "Onceq-Dead-Reason"
ORIGIN = "Onceq-Dead-From"
MSG_ID = "Onceq-Msg-Id"


class NatsSettling:
    """settle(): acks, NAKs and confirmed dead letters (state: NatsTransport's)."""

    stream: str
    durable: str
    dead_subject: str
    unsettled: int
    delayed: int
    _held: dict[int, list[Any]]
    _changed: asyncio.Event
    _js: Any

    async def settle(self, group: Sequence[tuple[Delivery, Settle, str]]) -> None:
        dead = [(d, reason) for d, decision, reason in group if decision is Settle.DEAD]
        stored: dict[int, bool] = {}
        if dead:
            # Every dead letter of the group published, PubAcks awaited together; only
            # then is any original acked.
            results = await asyncio.gather(*(self._dead_letter(d, r) for d, r in dead))
            stored = {id(d): ok for (d, _), ok in zip(dead, results, strict=True)}
            faults.hit("after-dead-publish")  # dead letters stored, originals not yet acked
        for delivery, decision, _reason in group:
            await self._settle_one(delivery, decision, stored.get(id(delivery), True))

    async def _settle_one(self, delivery: Delivery, decision: Settle, stored: bool) -> None:
        msg = delivery.token
        try:
            if decision is Settle.ACK or (decision is Settle.DEAD and stored):
                await msg.ack()
            elif decision is Settle.DELAY:
                await msg.nak(delay=delivery.delay)
                self.delayed += 1
            elif decision is Settle.DEAD:
                await msg.nak(delay=DEAD_RETRY_DELAY)
            else:  # REQUEUE, RELEASE
                await msg.nak()
            faults.hit("mid-settle")
        except Exception as exc:  # the connection is gone: the server redelivers it
            self.unsettled += 1
            log.warning(
                "%s (message_id %s): could not %s (%s); the server redelivers it after its"
                " AckWait and the ledger knows its outcome",
                delivery.ref,
                delivery.msg_id,
                SETTLE_VERBS[decision].split(" (")[0],
                type(exc).__name__,
                extra={"event": "settle-lost", "msg_id": delivery.msg_id},
            )
        finally:
            self._held.pop(id(delivery), None)
            self._changed.set()

    async def _dead_letter(self, delivery: Delivery, reason: str) -> bool:
        """Publish `delivery`'s dead letter and await its PubAck; False if not stored."""
        msg = delivery.token
        headers = {k: v for k, v in (msg.headers or {}).items() if not k.startswith("Nats-")}
        headers[REASON] = reason or "dead"
        headers[ORIGIN] = f"{self.stream}/{self.durable}"
        # The decoded id, else the publisher's (a copy that did not decode has none of
        # its own): what `nats dead` selects and the ledger knows it by.
        msg_id = delivery.msg_id or delivery.headers.get("message_id")
        if msg_id:
            headers[MSG_ID] = msg_id
        # One dead letter per stored message, however often it is settled (see above).
        headers["Nats-Msg-Id"] = f"{self.stream}:{delivery.headers.get('stream_seq', 0)}"
        try:
            await self._js.publish(
                self.dead_subject, msg.data, timeout=PUBACK_TIMEOUT, headers=headers
            )
        except Exception as exc:
            log.warning(
                "%s (message_id %s): its dead letter to %s was not stored (%s); given back,"
                " tried again in %gs",
                delivery.ref,
                delivery.msg_id,
                self.dead_subject,
                type(exc).__name__,
                DEAD_RETRY_DELAY,
                extra={"event": "dead-letter-unstored", "msg_id": delivery.msg_id},
            )
            return False
        return True
