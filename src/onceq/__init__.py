"""onceq: consume messages effectively once.

At-least-once delivery plus a ledger whose primary key refuses the second copy,
written in the same transaction as the business effect. Two transports share the
one consume loop (`onceq.consumer.Consumer`): a directory queue (`onceq.dirq`) and
RabbitMQ (`onceq.amqp`).
"""

from onceq.consumer import Consumer, Outcome, Stats
from onceq.errors import OnceqError
from onceq.ledger import Ledger
from onceq.transport import Delivery, Kind, Settle, decide

__all__ = [
    "Consumer",
    "Delivery",
    "Kind",
    "Ledger",
    "OnceqError",
    "Outcome",
    "Settle",
    "Stats",
    "decide",
]
__version__ = "0.1.0"
