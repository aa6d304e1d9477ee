"""The contract between the consume loop and a transport, and the settle decision.

A transport hands the loop `Delivery` objects and later settles them in groups.
It never touches the ledger: the loop records first and settles after the commit,
which is the one ordering every guarantee here rests on.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(eq=False)
class Delivery:
    """One copy of a message as a transport received it.

    `msg_id` is None when the transport cannot tell it without parsing (the
    directory queue); the loop's decoder fills it in. `ref` names the copy for
    humans (a file name; a delivery tag). `stable_ref` says the ref names the same
    copy across a crash (a file name does, a delivery tag does not), so that a row
    naming it proves the copy itself was already committed. `token` is the
    transport's own handle for settling it.
    """

    body: bytes
    ref: str
    msg_id: str | None = None
    redelivered: bool = False
    stable_ref: bool = False
    token: Any = None
    headers: dict[str, Any] = field(default_factory=dict)
    # The transport's own verdict, (reason, detail), on a copy it cannot pass on as it
    # is (RabbitMQ: a property or header that is not UTF-8): the loop dead-letters it
    # with that reason without decoding or trying it.
    refused: tuple[str, str] | None = None
    # Set by the loop when it settles this copy with Settle.DELAY: how many seconds it
    # waits (a RabbitMQ retry queue with that TTL, the directory queue's retry/ area).
    delay: float = 0.0


class Settle(enum.Enum):
    """What happens to a delivery once its record is durable."""

    ACK = "ack"  # done (processed or a duplicate): remove it from the queue
    REQUEUE = "requeue"  # transient failure: give it back for an immediate retry
    DELAY = "delay"  # transient failure: try again after `delivery.delay` seconds
    DEAD = "dead"  # poison, business rejection or out of attempts: dead-letter it
    # Never tried (the breaker is open): give it back untouched. Nothing is recorded
    # and no attempt is spent, since the message did nothing wrong.
    RELEASE = "release"


# What settling does, as a verb: "could not {verb}" in a log line reads as English
# ("could not dead-letter", never "could not dead").
SETTLE_VERBS: dict[Settle, str] = {
    Settle.ACK: "ack",
    Settle.REQUEUE: "requeue",
    Settle.DELAY: "ack (its copy is in its retry queue)",
    Settle.DEAD: "dead-letter",
    Settle.RELEASE: "give back (release)",
}


class Transport(Protocol):
    """What the consume loop needs from a queue.

    `deliveries` yields claimed copies until the transport has none left
    (directory queue, a drained broker queue) or until `stop()` is called. A
    transport's `stop()` only ends the deliveries: the loop still handles and settles
    every copy it received. A real stop (signal, deadline) is `Consumer.stop()`,
    which also starts no new handler call. `settle` receives a group of
    (delivery, decision, reason) only after the ledger commit that records them (a
    DELAY's seconds are `delivery.delay`); the transport may make the group durable
    once (one fsync of the folders, one multiple-ack) instead of once per message.
    """

    def deliveries(self) -> AsyncIterator[Delivery]: ...

    async def settle(self, group: Sequence[tuple[Delivery, Settle, str]]) -> None: ...

    def stop(self) -> None: ...


class Pausable(Protocol):
    """What a transport offers the circuit breaker (optional; the built-in ones do).

    `pause()`: hand out no more deliveries until `resume()` (a broker consumer is
    cancelled and what it had prefetched is returned; a directory queue stops
    claiming); `deliveries()` keeps waiting meanwhile, it does not end. `probe()`:
    while paused, hand out at most one more delivery (the breaker's probe). A
    transport without them still works under a breaker: the loop then holds each
    delivery it may not call until the breaker lets it, bounded by max_in_flight.
    """

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def probe(self) -> None: ...


# --- the settle decision --------------------------------------------------------------


class Kind(enum.Enum):
    """How a message's handling ended, before the ledger has spoken."""

    SUCCESS = "success"  # the effect happened; record it
    REJECTED = "rejected"  # will never succeed (parse error, 422): dead-letter at once
    TRANSIENT = "transient"  # may succeed later (503, timeout, connection refused)
    DUPLICATE = "duplicate"  # the ledger already holds this msg_id
    HELD = "held"  # not tried: the breaker is open (settled RELEASE, never recorded)


# The members as module names, for the code that runs per message. On Python 3.11 a
# member read off its class (`Kind.SUCCESS`) goes through EnumType.__getattr__'s
# slot, ~850 instructions, against a handful for a global: a directory-queue file
# read a dozen of them (Python 3.12 dropped the slot). Same objects: `is` holds.
ACK, REQUEUE, DELAY, DEAD, RELEASE = (
    Settle.ACK,
    Settle.REQUEUE,
    Settle.DELAY,
    Settle.DEAD,
    Settle.RELEASE,
)
SUCCESS, REJECTED, TRANSIENT, DUPLICATE, HELD = (
    Kind.SUCCESS,
    Kind.REJECTED,
    Kind.TRANSIENT,
    Kind.DUPLICATE,
    Kind.HELD,
)


def decide(kind: Kind, redelivered: bool, attempt: int = 1, max_attempts: int = 2) -> Settle:
    """The settle table in one place.

    | kind       | attempt < max_attempts | attempt == max_attempts (the retry) |
    | SUCCESS    | ACK                    | ACK                                 |
    | DUPLICATE  | ACK                    | ACK                                 |
    | REJECTED   | DEAD                   | DEAD                                |
    | TRANSIENT  | REQUEUE                | DEAD                                |

    This is the exercises' rule (`RetryPolicy.exercise()`); a flow's policy with
    delayed tiers is `onceq._core.retry.RetryPolicy.decide`, which agrees with this table
    whenever it has no tiers. A transient failure is retried once: requeueing without
    a bound would let one message circulate forever in front of everything else.
    `attempt` is counted durably in the ledger (failures recorded for this msg_id,
    plus this one), so
    "failed again" means exactly that. The broker's `redelivered` flag only says
    "may have been delivered before": it is also set on copies returned by a
    graceful stop or a dropped connection that were never tried, and deciding on
    it would dead-letter such a copy on its first real failure. It is kept in
    the signature (and recorded) so a rule that wants it can grow here.
    """
    del redelivered  # see above: the durable attempt count is the truthful signal
    if kind in (Kind.SUCCESS, Kind.DUPLICATE):
        return Settle.ACK
    if kind is Kind.HELD:
        return Settle.RELEASE
    if kind is Kind.REJECTED:
        return Settle.DEAD
    return Settle.DEAD if attempt >= max_attempts else Settle.REQUEUE
