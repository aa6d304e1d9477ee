"""Queue types: the arguments each of a flow's queues gets on a classic or quorum topology.

    classic (default): exactly the exercise's objects (and the retry tiers of issue 7).
    quorum: the work queue, the dead-letter queue and every retry tier are quorum queues
            (replicated: a message survives the loss of a minority of the broker's nodes).

Why every queue of the flow, and not only the work queue: a message lives in three
places during its life, and durability is only as good as the weakest of them.
- A retry tier holds the ONLY copy of a message for its whole delay (the original was
  acked once the copy was confirmed, onceq._sources.amqp.retry). A classic tier on a node that
  is lost loses that copy: a TTL tier must be as replicated as the work queue.
- The dead-letter queue holds what needs a human; losing it on a node loss loses
  exactly the messages nobody has looked at yet.

Quorum arguments, each for a reason (docs/mq.md, "Quorum queues", has the versions):
- x-delivery-limit = DELIVERY_LIMIT on the queues that are consumed or browsed (work
  queue and dead-letter queue). onceq's durable attempt count (the ledger's failure
  rows) decides when a message is dead; the broker's counter must never decide first.
  The broker counts returns, not attempts: a requeue (onceq's immediate retry), a
  breaker release, a channel lost with the message unacked, every `mq dead list`
  (it gets and hands back). RabbitMQ 4.0+ defaults the limit to 20 when none is set,
  so a quorum queue without one would dead-letter (or drop) messages after 20 of
  those, with no failure recorded. -1 means "unlimited" only from 4.0: on 3.x a
  message is dead-lettered at its FIRST return (measured on 3.10.8). A large finite
  limit reads the same on every version, and with a limit set a returned message goes
  back near the head (as a classic requeue does) instead of to the back (3.x without a
  limit), so ordered flows see the same order on both types.
- x-dead-letter-strategy = at-least-once, with x-overflow = reject-publish (the broker
  falls back to at-most-once under the default drop-head): a rejected poison message
  or an expired tier copy is kept by its source queue until the target queue
  confirmed it. The default, at-most-once, may lose it if a node fails mid-transfer.
  No x-max-length is set, so reject-publish refuses nothing in normal operation.
- Tiers get no delivery limit: nothing consumes them, nothing is ever returned.
"""

from __future__ import annotations

from typing import Any

CLASSIC = "classic"
QUORUM = "quorum"
QUEUE_TYPES = (CLASSIC, QUORUM)

# Returns of one message before the broker dead-letters it itself: far above anything
# onceq's own policy produces (a few immediate requeues; one release per breaker pause;
# one per lost channel), so the ledger's count decides. A message returned this often
# is stuck in a loop nobody wants forever either; the broker then dead-letters it,
# where `mq dead list` shows it (x-death reason delivery_limit).
DELIVERY_LIMIT = 1_000_000

# The arguments of at-least-once dead-lettering (quorum queues, RabbitMQ 3.10+).
AT_LEAST_ONCE = {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}


def type_problem(queue_type: object) -> str:
    """Why `queue_type` is not a queue type onceq declares, or ''."""
    if queue_type in QUEUE_TYPES:
        return ""
    return f"must be {' or '.join(repr(t) for t in QUEUE_TYPES)}"


def work_arguments(queue_type: str, dead_letter_exchange: str, dead_key: str) -> dict[str, Any]:
    """The work queue's: dead-lettering (both types), plus the quorum ones above."""
    args: dict[str, Any] = {
        "x-dead-letter-exchange": dead_letter_exchange,
        "x-dead-letter-routing-key": dead_key,
    }
    if queue_type == QUORUM:
        args = {"x-queue-type": QUORUM, **args, **AT_LEAST_ONCE, "x-delivery-limit": DELIVERY_LIMIT}
    return args


def dead_arguments(queue_type: str) -> dict[str, Any]:
    """The dead-letter queue's: none on classic; quorum with the delivery limit, since
    every `mq dead list` returns what it browsed (counted as a return)."""
    if queue_type == QUORUM:
        return {"x-queue-type": QUORUM, "x-delivery-limit": DELIVERY_LIMIT}
    return {}


def tier_arguments(queue_type: str, ttl_ms: int, work_queue: str) -> dict[str, Any]:
    """A retry tier's: its TTL, then dead-lettered through "" to the work queue."""
    args: dict[str, Any] = {
        "x-message-ttl": ttl_ms,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": work_queue,
    }
    if queue_type == QUORUM:
        args = {"x-queue-type": QUORUM, **args, **AT_LEAST_ONCE}
    return args
