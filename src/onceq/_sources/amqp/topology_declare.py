"""Declaring topologies on the broker: planned first, checked before created.

A refused declaration changes nothing: every object that already exists is
re-declared with our attributes FIRST (a 406 there means the broker holds it
with other attributes, and we stop before creating anything), and only then
are the missing objects created. Redeclaring an equal object is a no-op, so a
second run changes nothing either.
"""

from __future__ import annotations

from typing import Any

from onceq._sources.amqp.topology import Binding, Exchange, Queue, Topology
from onceq._sources.amqp.url import boundary, close_quietly, connect
from onceq.errors import UsageError


def plan(topologies: tuple[Topology, ...]) -> tuple[list[Exchange | Queue], list[Binding]]:
    """The objects of every topology, each once; UsageError if two want one name differently.

    Several flows may share an exchange or a dead-letter exchange; one queue that a
    flow wants as its input (with dead-lettering) and another as a plain dead-letter
    queue cannot be both, and the broker would answer the second with a 406 after
    the first had been created: refused here, before connecting.
    """
    objects: dict[str, Exchange | Queue] = {}
    bindings: dict[Binding, None] = {}
    for t in topologies:
        objs, binds = t.objects()
        for o in objs:
            key = f"{type(o).__name__} {o.name}"
            if key in objects and objects[key] != o:
                raise UsageError(
                    f"{o.label}: wanted with two different sets of attributes by the flows"
                    f" (e.g. as an input queue and as a dead-letter queue)"
                )
            objects.setdefault(key, o)
        bindings.update(dict.fromkeys(binds))
    return list(objects.values()), list(bindings)


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


async def declare(url: str, *topologies: Topology) -> dict[str, str]:
    """Declare the topologies (none given: the claims preset) in the URL's vhost.

    Returns {object: 'exists' | 'created' | 'bound'}. Every name is checked before
    connecting (UsageError naming the option), so a bad name creates nothing.
    """
    chosen = topologies or (Topology.claims(),)
    for t in chosen:
        t.check()
    objects, bindings = plan(chosen)
    connection = await connect(url)
    try:
        result: dict[str, str] = {}
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
        for b in bindings:  # binding twice is a no-op in AMQP 0-9-1
            with boundary(url, b.label):
                await channel.queue_bind(queue=b.queue, exchange=b.exchange, routing_key=b.key)
            result[b.label] = "bound"
        return result
    finally:
        await close_quietly(connection)
