"""The claims topology, declared idempotently.

    eai.claim (direct) --claim--> claim.in --(reject, requeue=False)--> eai.dlx (direct)
                                                                 --claim.dead--> claim.dead

A refused declaration changes nothing: every object that already exists is
re-declared with our attributes FIRST (a 406 there means the broker holds it
with other attributes, and we stop before creating anything), and only then
are the missing objects created. Redeclaring an equal object is a no-op, so a
second run changes nothing either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from onceq.amqp.url import boundary, close_quietly, connect

EXCHANGE = "eai.claim"
DLX = "eai.dlx"
QUEUE = "claim.in"
DEAD_QUEUE = "claim.dead"
ROUTING_KEY = "claim"
DEAD_KEY = "claim.dead"


@dataclass(frozen=True)
class Exchange:
    name: str
    type: str = "direct"
    durable: bool = True

    @property
    def label(self) -> str:
        return f"exchange {self.name}"


@dataclass(frozen=True)
class Queue:
    name: str
    durable: bool = True
    arguments: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"queue {self.name}"


@dataclass(frozen=True)
class Binding:
    exchange: str
    queue: str
    key: str

    @property
    def label(self) -> str:
        return f"binding {self.exchange}->{self.queue} ({self.key})"


EXCHANGES = (Exchange(EXCHANGE), Exchange(DLX))
QUEUES = (
    # Rejected messages (requeue=False) go to eai.dlx with key claim.dead, so a poison
    # message leaves claim.in at once instead of circulating in front of the others.
    Queue(QUEUE, arguments={"x-dead-letter-exchange": DLX, "x-dead-letter-routing-key": DEAD_KEY}),
    Queue(DEAD_QUEUE),
)
BINDINGS = (Binding(EXCHANGE, QUEUE, ROUTING_KEY), Binding(DLX, DEAD_QUEUE, DEAD_KEY))


async def _declare(channel: Any, obj: Exchange | Queue, *, passive: bool = False) -> None:
    if isinstance(obj, Exchange):
        await channel.exchange_declare(
            exchange=obj.name, exchange_type=obj.type, durable=obj.durable, passive=passive
        )
    else:
        await channel.queue_declare(
            queue=obj.name,
            durable=obj.durable,
            arguments=None if passive else obj.arguments,
            passive=passive,
        )


async def _exists(connection: Any, obj: Exchange | Queue) -> bool:
    """A passive declare: 404 closes the channel, so each check gets its own."""
    import aiormq.exceptions as ae

    channel = await connection.channel()
    try:
        await _declare(channel, obj, passive=True)
    except ae.ChannelNotFoundEntity:
        return False
    await channel.close()
    return True


async def declare(url: str) -> dict[str, str]:
    """Declare the topology in the URL's vhost; returns {object: 'exists' | 'created'}."""
    connection = await connect(url)
    try:
        result: dict[str, str] = {}
        objects: list[Exchange | Queue] = [*EXCHANGES, *QUEUES]
        with boundary(url):
            present = [o for o in objects if await _exists(connection, o)]
        channel = await connection.channel()
        for obj in present:  # check (redeclare) what exists before creating anything
            with boundary(url, obj.label):
                await _declare(channel, obj)
            result[obj.label] = "exists"
        for obj in objects:
            if obj not in present:
                with boundary(url, obj.label):
                    await _declare(channel, obj)
                result[obj.label] = "created"
        for b in BINDINGS:  # binding twice is a no-op in AMQP 0-9-1
            with boundary(url, b.label):
                await channel.queue_bind(queue=b.queue, exchange=b.exchange, routing_key=b.key)
            result[b.label] = "bound"
        return result
    finally:
        await close_quietly(connection)
