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

`queue_type` (classic | quorum) chooses the queues' arguments (topology_types); the
names follow topology_names; declaring them is topology_declare (all in onceq._sources.amqp).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from onceq._core.retry import delay_label
from onceq._sources.amqp.topology_names import (
    DEAD_KEY,
    DEAD_QUEUE,
    DLX,
    EXCHANGE,
    IN_SUFFIX,
    MAX_NAME,
    QUEUE,
    RETRY_INFIX,
    ROUTING_KEY,
    name_problem,
    option_label,
    stem_of,
)
from onceq._sources.amqp.topology_types import (
    CLASSIC,
    dead_arguments,
    tier_arguments,
    type_problem,
    work_arguments,
)
from onceq.errors import UsageError

# Re-exported: every caller keeps importing the names from here (declaring them on the
# broker is topology_declare, which imports Topology: not re-exported, no cycle).
__all__ = [
    "BINDINGS",
    "DEAD_KEY",
    "DEAD_QUEUE",
    "DLX",
    "EXCHANGE",
    "EXCHANGES",
    "IN_SUFFIX",
    "MAX_NAME",
    "QUEUE",
    "QUEUES",
    "RETRY_INFIX",
    "ROUTING_KEY",
    "Binding",
    "Exchange",
    "Queue",
    "Topology",
    "name_problem",
    "option_label",
    "stem_of",
]


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
    queue_type: str = CLASSIC  # "classic" | "quorum": onceq._sources.amqp.topology_types

    @classmethod
    def claims(cls, retry_delays: tuple[float, ...] = (), queue_type: str = CLASSIC) -> Topology:
        """The exercise's names, exactly as before issue 7 (plus the tiers given)."""
        return cls(QUEUE, EXCHANGE, ROUTING_KEY, DLX, DEAD_QUEUE, tuple(retry_delays), queue_type)

    @classmethod
    def for_queue(
        cls,
        queue: str,
        exchange: str | None = None,
        routing_key: str | None = None,
        dead_letter_exchange: str | None = None,
        dead_letter_queue: str | None = None,
        retry_delays: tuple[float, ...] = (),
        queue_type: str = CLASSIC,
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
            queue_type=queue_type,
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
            # None (a flow file without the key) and a source without the field: classic.
            getattr(source, "queue_type", None) or CLASSIC,
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
        queue_type: str = CLASSIC,
    ) -> Topology:
        """The CLI's rule: with a queue, `for_queue`; without, the claims names with
        whichever of the others were given."""
        if queue is not None:
            return cls.for_queue(
                queue,
                exchange,
                routing_key,
                dead_letter_exchange,
                dead_letter_queue,
                retry_delays,
                queue_type,
            )
        # Only str fields; typed Any because mypy checks a ** spread against every field
        # of the dataclass (retry_delays is a tuple), not only the keys this dict holds.
        given: dict[str, Any] = {
            "exchange": exchange,
            "routing_key": routing_key,
            "dead_letter_exchange": dead_letter_exchange,
            "dead_letter_queue": dead_letter_queue,
        }
        return dataclasses.replace(
            cls.claims(retry_delays, queue_type),
            **{k: v for k, v in given.items() if v is not None},
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
            if f.name in ("retry_delays", "queue_type"):
                continue
            value = getattr(self, f.name)
            why = name_problem(
                value, declared=f.name != "routing_key", empty_ok=f.name == "routing_key"
            )
            if why:
                out.append(f"{label(f.name)}: {value!r}: {why}")
        why = type_problem(self.queue_type)
        if why:
            out.append(f"{label('queue_type')}: {self.queue_type!r}: {why}")
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
                arguments=tier_arguments(self.queue_type, round(delay * 1000), self.queue),
            )
            for delay in self.retry_delays
        ]

    def objects(self) -> tuple[list[Exchange | Queue], list[Binding]]:
        queue = Queue(
            self.queue,
            # Rejected messages (requeue=False) go to the dead-letter exchange with the
            # dead key, so a poison message leaves the queue at once instead of
            # circulating in front of the others. On quorum: onceq._sources.amqp.topology_types.
            arguments=work_arguments(self.queue_type, self.dead_letter_exchange, self.dead_key),
        )
        return (
            [
                Exchange(self.exchange),
                Exchange(self.dead_letter_exchange),
                queue,
                Queue(self.dead_letter_queue, arguments=dead_arguments(self.queue_type)),
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
