"""A flow's RabbitMQ names (`Topology`), declared idempotently.

    EXCHANGE (direct) --ROUTING_KEY--> QUEUE --(reject, requeue=False)--> DLX (direct)
                                                           --DEAD_QUEUE--> DEAD_QUEUE
    STEM.retry.5s (TTL 5 s) --(expired: default exchange, key QUEUE)--> QUEUE

The retry tiers (`retry_delays`, one queue per delay of the flow's retry policy)
are never consumed: a copy waits there for the queue's TTL, then the broker
dead-letters it through the default exchange straight back to QUEUE (no binding,
so no other queue bound to EXCHANGE gets a copy).

`Topology.claims()` is the exercise's preset (eai.claim, claim, claim.in, eai.dlx,
claim.dead); `Topology.for_queue("invoice.in")` derives the rest of a user's names
from the queue (invoice, invoice, invoice.dlx, invoice.dead), each overridable.

A refused declaration changes nothing: every object that already exists is
re-declared with our attributes FIRST (a 406 there means the broker holds it
with other attributes, and we stop before creating anything), and only then
are the missing objects created. Redeclaring an equal object is a no-op, so a
second run changes nothing either.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from onceq.amqp.url import boundary, close_quietly, connect
from onceq.errors import UsageError
from onceq.ledger_values import is_utf8
from onceq.retry import delay_label

# The claims preset's names (the exercise's): kept as constants for what names them.
EXCHANGE = "eai.claim"
DLX = "eai.dlx"
QUEUE = "claim.in"
DEAD_QUEUE = "claim.dead"
ROUTING_KEY = "claim"
DEAD_KEY = "claim.dead"

# AMQP 0-9-1 carries every name as a shortstr: one length byte, so 255 bytes of UTF-8.
MAX_NAME = 255
# The suffix a user's input queue usually carries; its stem names the rest.
IN_SUFFIX = ".in"
# A retry tier's name: STEM.retry.LABEL (claim.retry.5s, invoice.retry.2m).
RETRY_INFIX = ".retry."


def stem_of(queue: str) -> str:
    """The queue without a trailing ".in" ("invoice.in" → "invoice"), else the queue."""
    return queue[: -len(IN_SUFFIX)] if queue.endswith(IN_SUFFIX) and queue != IN_SUFFIX else queue


def name_problem(value: str, *, declared: bool = True, empty_ok: bool = False) -> str:
    """Why `value` cannot be an exchange, queue or routing-key name, or ''.

    Checked before connecting: on the wire a lone surrogate or a name over 255
    bytes is a traceback half-way through a command, and the broker answers an
    `amq.` name we would declare with 403 ACCESS_REFUSED, closing the channel.
    """
    if not value:
        return "" if empty_ok else "must not be empty"
    if not is_utf8(value):
        return "holds a lone surrogate (\\ud800-\\udfff), not Unicode text"
    size = len(value.encode("utf-8"))
    if size > MAX_NAME:
        return f"is {size} bytes; an AMQP name holds at most {MAX_NAME}"
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        return "holds a control character"
    if declared and value.startswith("amq."):
        return "names starting with 'amq.' are reserved by the broker"
    return ""


def option_label(field_name: str) -> str:
    """The CLI's name of a Topology field: dead_letter_queue → --dead-letter-queue."""
    return "--" + field_name.replace("_", "-")


@dataclass(frozen=True)
class Topology:
    """The five names of one flow's RabbitMQ objects, and its retry tiers.

    Dead letters are routed with the dead-letter queue's name as their key, as the
    claims preset does (claim.in → eai.dlx, key claim.dead → claim.dead).
    `retry_delays` (seconds, the flow's `RetryPolicy.delays`) adds one retry queue
    per delay (`retry_queue`); empty, the topology is exactly the exercise's.
    """

    queue: str
    exchange: str
    routing_key: str
    dead_letter_exchange: str
    dead_letter_queue: str
    retry_delays: tuple[float, ...] = ()

    @classmethod
    def claims(cls, retry_delays: tuple[float, ...] = ()) -> Topology:
        """The exercise's names, exactly as before issue 7 (plus the tiers given)."""
        return cls(QUEUE, EXCHANGE, ROUTING_KEY, DLX, DEAD_QUEUE, tuple(retry_delays))

    @classmethod
    def for_queue(
        cls,
        queue: str,
        exchange: str | None = None,
        routing_key: str | None = None,
        dead_letter_exchange: str | None = None,
        dead_letter_queue: str | None = None,
        retry_delays: tuple[float, ...] = (),
    ) -> Topology:
        """A user's queue; each name not given is derived from the queue's stem.

        The stem is the queue without a trailing ".in" ("invoice.in" → "invoice"),
        else the queue itself: exchange = routing key = stem, dead-letter exchange =
        stem + ".dlx", dead-letter queue = stem + ".dead". So `invoice.in` gives
        invoice --invoice--> invoice.in → invoice.dlx --invoice.dead--> invoice.dead.
        """
        stem = stem_of(queue)
        return cls(
            queue=queue,
            exchange=stem if exchange is None else exchange,
            routing_key=stem if routing_key is None else routing_key,
            dead_letter_exchange=f"{stem}.dlx"
            if dead_letter_exchange is None
            else dead_letter_exchange,
            dead_letter_queue=f"{stem}.dead" if dead_letter_queue is None else dead_letter_queue,
            retry_delays=tuple(retry_delays),
        )

    @classmethod
    def for_source(cls, source: Any, retry_delays: tuple[float, ...] = ()) -> Topology:
        """The names a flow's RabbitSource declares: its queue's, each one given overriding.

        `retry_delays`: the flow's tiers (`flow.retry_policy().delays`), see `for_flow`.
        """
        return cls.for_queue(
            source.queue,
            source.exchange,
            source.routing_key,
            source.dead_letter_exchange,
            source.dead_letter_queue,
            retry_delays,
        )

    @classmethod
    def for_flow(cls, flow: Any) -> Topology:
        """A rabbitmq flow's objects: its source's names and its retry policy's tiers."""
        return cls.for_source(flow.source, flow.retry_policy().delays)

    @classmethod
    def from_options(
        cls,
        queue: str | None = None,
        exchange: str | None = None,
        routing_key: str | None = None,
        dead_letter_exchange: str | None = None,
        dead_letter_queue: str | None = None,
        retry_delays: tuple[float, ...] = (),
    ) -> Topology:
        """The CLI's rule: with a queue, `for_queue`; without, the claims names with
        whichever of the others were given."""
        if queue is not None:
            return cls.for_queue(
                queue, exchange, routing_key, dead_letter_exchange, dead_letter_queue, retry_delays
            )
        given = {
            "exchange": exchange,
            "routing_key": routing_key,
            "dead_letter_exchange": dead_letter_exchange,
            "dead_letter_queue": dead_letter_queue,
        }
        return dataclasses.replace(
            cls.claims(retry_delays), **{k: v for k, v in given.items() if v is not None}
        )

    @property
    def dead_key(self) -> str:
        return self.dead_letter_queue

    @property
    def stem(self) -> str:
        return stem_of(self.queue)

    def retry_queue(self, delay: float) -> str:
        """The tier queue of `delay` seconds: STEM.retry.LABEL (claim.retry.5s)."""
        return f"{self.stem}{RETRY_INFIX}{delay_label(delay)}"

    @property
    def retry_queues(self) -> tuple[str, ...]:
        return tuple(self.retry_queue(d) for d in self.retry_delays)

    def problems(self, label: Callable[[str], str] = option_label) -> list[str]:
        """Every mistake, one line each: '<label>: <value>: <why>' (empty when none).

        `label` names a field as the user wrote it: an option (--queue) on the CLI,
        a key (flows.invoices.queue) in a flow file.
        """
        out = []
        for f in dataclasses.fields(self):
            if f.name == "retry_delays":
                continue
            value = getattr(self, f.name)
            why = name_problem(
                value, declared=f.name != "routing_key", empty_ok=f.name == "routing_key"
            )
            if why:
                out.append(f"{label(f.name)}: {value!r}: {why}")
        if not out and self.queue == self.dead_letter_queue:
            out.append(
                f"{label('dead_letter_queue')}: {self.queue!r}: is the queue itself;"
                " its dead letters would come straight back"
            )
        if not out and (self.exchange, self.routing_key) == (
            self.dead_letter_exchange,
            self.dead_key,
        ):
            out.append(
                f"{label('routing_key')}: {self.routing_key!r}: on {self.exchange!r} it is"
                " also the dead-letter key, so every message would reach the dead-letter queue"
            )
        if not out:
            out.extend(self._tier_problems(label))
        return out

    def _tier_problems(self, label: Callable[[str], str]) -> list[str]:
        """A retry queue's name is derived from the queue: too long, or taken already.

        Named by the queue's label (the name it derives from). A dead-letter queue
        that is also a tier would get both sets of arguments: refused before connecting.
        """
        out = []
        for delay, name in zip(self.retry_delays, self.retry_queues, strict=True):
            why = name_problem(name)
            if why:
                out.append(
                    f"{label('queue')}: {self.queue!r}: its {delay_label(delay)} retry queue"
                    f" {name!r} {why}"
                )
            elif name == self.dead_letter_queue:
                out.append(
                    f"{label('dead_letter_queue')}: {name!r}: is also the"
                    f" {delay_label(delay)} retry queue of {self.queue!r}"
                )
        return out

    def check(self, label: Callable[[str], str] = option_label) -> Topology:
        """self, or UsageError with the first problem (one line)."""
        found = self.problems(label)
        if found:
            raise UsageError(found[0])
        return self

    def tier_objects(self) -> list[Queue]:
        """One durable queue per retry delay, never consumed.

        A fixed TTL per QUEUE (x-message-ttl), not a per-message expiration: the broker
        expires per-message TTLs only at the head of a queue, so in one shared delay
        queue a 5 s copy would wait behind a 10 min one. Here every copy of a tier has
        the same TTL, so the head always expires first and each delay is exact.
        Expired copies are dead-lettered through the default exchange ("") with the
        work queue's name as key: straight to the work queue, without a binding.
        """
        return [
            Queue(
                self.retry_queue(delay),
                arguments={
                    "x-message-ttl": round(delay * 1000),
                    "x-dead-letter-exchange": "",
                    "x-dead-letter-routing-key": self.queue,
                },
            )
            for delay in self.retry_delays
        ]

    def objects(self) -> tuple[list[Exchange | Queue], list[Binding]]:
        queue = Queue(
            self.queue,
            # Rejected messages (requeue=False) go to the dead-letter exchange with the
            # dead key, so a poison message leaves the queue at once instead of
            # circulating in front of the others.
            arguments={
                "x-dead-letter-exchange": self.dead_letter_exchange,
                "x-dead-letter-routing-key": self.dead_key,
            },
        )
        return (
            [
                Exchange(self.exchange),
                Exchange(self.dead_letter_exchange),
                queue,
                Queue(self.dead_letter_queue),
                *self.tier_objects(),
            ],
            [
                Binding(self.exchange, self.queue, self.routing_key),
                Binding(self.dead_letter_exchange, self.dead_letter_queue, self.dead_key),
            ],
        )


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


_CLAIMS_OBJECTS = Topology.claims().objects()
EXCHANGES = tuple(o for o in _CLAIMS_OBJECTS[0] if isinstance(o, Exchange))
QUEUES = tuple(o for o in _CLAIMS_OBJECTS[0] if isinstance(o, Queue))
BINDINGS = tuple(_CLAIMS_OBJECTS[1])


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
