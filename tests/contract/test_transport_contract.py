"""One suite, every transport, every kind of handler: what the consume loop promises.

Each transport (in-memory, directory queue, RabbitMQ) is driven through the same
`Consumer` with the same messages — distinct ones, re-sent copies (some in flight
together), poison — and with each kind of handler: `no_effect` (the ledger row is the
effect), a real async handler that awaits before it answers, and one that fails
some messages (a business rejection, a transient failure). The suite checks the
promises, not the mechanics: every copy claimed is settled (the transport ends with
nothing held: processing/ empty, the broker queue empty with 0 unacked), each settle
comes after its record is durable, one ledger row per msg_id, failures dead-lettered
with their reason after the retries the transport allows. The RabbitMQ variant runs
against the real broker in a temporary vhost, the NATS variant against the shared
JetStream server with a stream of its own (each fails under CI=true when its server is
missing).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nats_support import nats_names_fixture  # noqa: F401  (the fixture nats_names)
from onceq._core.consumer import Consumer, Handler, Outcome, no_effect
from onceq._core.transport import Delivery, Kind, Settle, Transport
from onceq._exercise.orders_0_1_0 import MessageSpec, decode
from onceq._ledger.sqlite import Ledger
from onceq._sources.dirq.files import write_atomic
from onceq._sources.dirq.queue import DirQueue
from onceq._sources.dirq.worker import Worker
from onceq._sources.memory import MemoryTransport


@dataclass
class Spy:
    """Wraps a transport; records what is settled and checks it was durable first."""

    inner: Transport
    ledger_path: Path
    ref_of: Callable[[Delivery], str] = lambda d: d.ref
    expected: int = 0  # end the deliveries once this many copies are finished (broker)
    settled: Counter[str] = field(default_factory=Counter)
    outcomes: dict[str, tuple[Settle, str]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    def deliveries(self) -> AsyncIterator[Delivery]:
        return self.inner.deliveries()

    def stop(self) -> None:
        self.inner.stop()

    async def settle(self, group: Sequence[tuple[Delivery, Settle, str]]) -> None:
        with Ledger(self.ledger_path) as other:  # its own connection: sees commits only
            for d, settle, reason in group:
                self.settled[self.ref_of(d)] += 1
                self.outcomes[self.ref_of(d)] = (settle, reason)
                if settle is Settle.ACK and other.processed_ref(d.msg_id or "") is None:
                    self.violations.append(f"{d.ref}: acked before its row was durable")
                if settle is not Settle.ACK and other.last_failure(d.ref) is None:
                    self.violations.append(f"{d.ref}: {settle.value} before its failure row")
        await self.inner.settle(group)
        finished = sum(1 for s, _ in self.outcomes.values() if s is not Settle.REQUEUE)
        if self.expected and finished >= self.expected:
            # A broker never runs dry by itself. This is the transport running out (the
            # same as an empty directory queue), not Consumer.stop(): everything already
            # received must still be handled and settled.
            self.inner.stop()


def message(msg_id: str, seq: int = 1) -> bytes:
    return json.dumps({"msg_id": msg_id, "order_no": "A-1", "seq": seq, "amount": 10}).encode()


# (ref, body): 40 distinct, 3 copies of m-0005 and one of m-0017, two poison.
MESSAGES: list[tuple[str, bytes]] = [
    (f"msg-{i:03d}.json", message(f"m-{i:04d}", i)) for i in range(40)
] + [
    ("msg-100.json", message("m-0005", 5)),
    ("msg-101.json", message("m-0005", 5)),
    ("msg-102.json", message("m-0005", 5)),
    ("msg-103.json", message("m-0017", 17)),
    ("msg-104.json", b'{"msg_id": "broken"'),
    ("msg-105.json", json.dumps({"msg_id": "m-x", "order_no": "A", "seq": 1}).encode()),
]
UNIQUE = 40
COPIES = 4
POISON = {"msg-104.json": "parse", "msg-105.json": "missing-field"}
# What the failing handler does to whom (ids with no copies, so counts stay simple).
REJECTED_REF, REJECTED_ID = "msg-020.json", "m-0020"
BUSY_REF, BUSY_ID = "msg-030.json", "m-0030"


class Partner:
    """A real async handler: it awaits (the loop runs other work meanwhile), counts calls.

    With `failing`, m-0020 is a business rejection (http-422, never retried) and
    m-0030 a transient failure (http-503: retried where the transport redelivers).
    """

    def __init__(self, failing: bool = False) -> None:
        self.failing = failing
        self.calls: Counter[str] = Counter()

    async def __call__(self, d: Delivery, fields: dict[str, Any]) -> Outcome:
        assert d.msg_id is not None
        self.calls[d.msg_id] += 1
        await asyncio.sleep(0.001)
        if self.failing and d.msg_id == REJECTED_ID:
            return Outcome(Kind.REJECTED, "http-422", "docs missing")
        if self.failing and d.msg_id == BUSY_ID:
            return Outcome(Kind.TRANSIENT, "http-503", "busy")
        return Outcome(Kind.SUCCESS, fields=fields)


@dataclass
class Run:
    transport: str
    handler: str
    spy: Spy
    ledger: Ledger
    stats: Any
    poison: dict[str, str]
    unique: int
    partner: Partner | None
    left: dict[str, Any]  # what the transport holds at the end (see each runner)

    @property
    def failing(self) -> bool:
        return self.handler == "failing"

    @property
    def retries(self) -> bool:
        """The transport redelivers a requeued copy (a directory queue quarantines it)."""
        return self.transport != "dirq"

    def dead(self) -> dict[str, str]:
        """ref -> reason of every copy that must end dead-lettered / quarantined."""
        out = dict(self.poison)
        if self.failing:
            out[REJECTED_REF] = "http-422"
            out[BUSY_REF] = "http-503"
        return out


def _dirq_spec_decode(d: Delivery) -> Outcome:
    return decode(d, MessageSpec())


def _handler(kind: str) -> tuple[Handler, Partner | None]:
    if kind == "no_effect":
        return no_effect, None
    partner = Partner(failing=kind == "failing")
    return partner, partner


async def run_memory(tmp_path: Path, db: Path, handler: Handler) -> tuple[Any, ...]:
    t = MemoryTransport(Delivery(body=b, ref=ref) for ref, b in MESSAGES)
    spy = Spy(t, db)
    stats = await _run(spy, db, _dirq_spec_decode, handler, max_attempts=2)
    left = {"queue": len(t.queue), "outstanding": t._outstanding, "dead": len(t.dead)}
    return spy, stats, POISON, UNIQUE, left


async def run_dirq(tmp_path: Path, db: Path, handler: Handler) -> tuple[Any, ...]:
    q = DirQueue(tmp_path / "q")
    q.init()
    for ref, body in MESSAGES:
        write_atomic(q.folder("inbox"), ref, body)
    with Worker(q, MessageSpec().max_bytes) as w:
        spy = Spy(w, db)
        # As `onceq dirq consume` runs it: no redelivery, what fails once is quarantined.
        stats = await _run(spy, db, _dirq_spec_decode, handler, max_attempts=1)
    left = {
        f: sorted(str(p.relative_to(q.folder(f))) for p in q.folder(f).rglob("*"))
        for f in ("inbox", "processing", "done", "error")
    }
    return spy, stats, POISON, UNIQUE, left


async def run_amqp(url: str, db: Path, handler: Handler) -> tuple[Any, ...]:
    import aio_pika

    from onceq._exercise import claims_0_1_0 as claim
    from onceq._sources.amqp.topology_declare import declare
    from onceq._sources.amqp.transport import AmqpTransport

    await declare(url)
    conn = await aio_pika.connect(url)
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        ex = await ch.get_exchange("eai.claim")
        for ref, body in MESSAGES:
            try:
                msg_id = json.loads(body)["msg_id"]
            except ValueError:
                msg_id = "unparseable"
            await ex.publish(
                aio_pika.Message(body, message_id=msg_id, headers={"ref": ref}), "claim"
            )
    transport = AmqpTransport(url, prefetch=8)
    await transport.open()
    await transport.start()
    try:
        spy = Spy(transport, db, lambda d: d.token.headers["ref"], expected=len(MESSAGES))
        stats = await _run(spy, db, claim.decode, handler, max_attempts=2)
    finally:
        await transport.close()
    from mq_support import queues

    # Claims need no amount: msg-105 is a valid claim on this transport.
    return spy, stats, {"msg-104.json": "parse"}, UNIQUE + 1, {"queues": queues(url)}


async def run_nats(names: Any, db: Path, handler: Handler) -> tuple[Any, ...]:
    from nats_support import aconsumer_state, apublish
    from onceq._sources.nats.setup import Setup, setup
    from onceq._sources.nats.transport import NatsTransport

    await setup(names.url, Setup(names.stream, names.subject, names.durable))
    # Each file its own Nats-Msg-Id: the re-sent copies are distinct messages for the
    # server (as copies outside its duplicate window are), so the ledger meets them.
    await apublish(names, [(body, {"ref": ref, "Nats-Msg-Id": ref}) for ref, body in MESSAGES])
    transport = NatsTransport(names.url, stream=names.stream, durable=names.durable, prefetch=8)
    await transport.open()
    await transport.start()
    try:
        spy = Spy(transport, db, lambda d: d.token.headers["ref"], expected=len(MESSAGES))
        stats = await _run(spy, db, _dirq_spec_decode, handler, max_attempts=2)
    finally:
        await transport.close()
    state = await aconsumer_state(names)
    left = {k: state[k] for k in ("pending", "ack_pending", "stored", "dead")}
    return spy, stats, POISON, UNIQUE, left


async def _run(
    spy: Spy, db: Path, dec: Callable[[Delivery], Outcome], handler: Handler, **kw: Any
) -> Any:
    with Ledger(db, source="contract") as ledger:
        consumer = Consumer(spy, ledger, dec, handler, max_in_flight=8, max_group=5, **kw)
        return await asyncio.wait_for(consumer.run(), 60)


@pytest.fixture(params=["no_effect", "async", "failing"])
def handler_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["memory", "dirq", "amqp", "nats"])
def contract_run(
    request: pytest.FixtureRequest, handler_kind: str, tmp_path: Path
) -> Iterator[Run]:
    db = tmp_path / "ledger.db"
    handler, partner = _handler(handler_kind)
    if request.param == "amqp":
        url = request.getfixturevalue("amqp_url")  # a temporary vhost on the real broker
        out = asyncio.run(run_amqp(url, db, handler))
    elif request.param == "nats":
        names = request.getfixturevalue("nats_names")  # a stream of its own, deleted after
        out = asyncio.run(run_nats(names, db, handler))
    else:
        runner = run_memory if request.param == "memory" else run_dirq
        out = asyncio.run(runner(tmp_path, db, handler))
    spy, stats, poison, unique, left = out
    with Ledger(db) as ledger:
        yield Run(request.param, handler_kind, spy, ledger, stats, poison, unique, partner, left)


def test_every_copy_is_settled_and_never_before_its_record(contract_run: Run) -> None:
    r = contract_run
    assert r.spy.violations == []
    assert sorted(r.spy.settled) == sorted(ref for ref, _ in MESSAGES)
    # Once each; the transient failure twice where the transport redelivers it.
    twice = {BUSY_REF} if r.failing and r.retries else set()
    assert {ref for ref, n in r.spy.settled.items() if n != 1} == twice
    assert all(r.spy.settled[ref] == 2 for ref in twice)
    assert r.stats.received == len(MESSAGES) + len(twice)


def test_everything_claimed_ends_settled_in_the_transport(contract_run: Run) -> None:
    r = contract_run
    dead = r.dead()
    final = {ref: s for ref, (s, _) in r.spy.outcomes.items()}
    assert {ref for ref, s in final.items() if s is Settle.DEAD} == set(dead)
    assert {ref for ref, s in final.items() if s is Settle.ACK} == {
        ref for ref, _ in MESSAGES if ref not in dead
    }
    if r.transport == "dirq":
        # Nothing stranded in a claim folder: the worker's folder is gone too.
        assert r.left["processing"] == [] and r.left["inbox"] == []
        assert r.left["error"] == sorted(dead)
        assert r.left["done"] == sorted(ref for ref, _ in MESSAGES if ref not in dead)
    elif r.transport == "amqp":
        assert r.left["queues"]["claim.in"] == (0, 0)  # nothing ready, nothing unacked
        assert r.left["queues"]["claim.dead"] == (len(dead), 0)
    elif r.transport == "nats":
        # Nothing pending or unacked; the work stream emptied (work-queue retention), the
        # dead letters stored in the flow's dead-letter stream.
        assert r.left == {"pending": 0, "ack_pending": 0, "stored": 0, "dead": len(dead)}
    else:
        assert r.left == {"queue": 0, "outstanding": 0, "dead": len(dead)}


def test_ledger_rows_and_calls_match(contract_run: Run) -> None:
    r = contract_run
    dead = r.dead()
    failed = 2 if r.failing else 0
    assert r.ledger.counts()["processed"] == r.unique - failed
    assert r.stats.processed == r.unique - failed
    assert r.stats.duplicates == COPIES
    assert r.ledger.duplicate_ids() == ["m-0005", "m-0017"]
    assert r.stats.dead == len(dead)
    requeued = 1 if r.failing and r.retries else 0
    assert r.stats.requeued == requeued
    assert sorted(row["reason"] for row in r.ledger.dead_letters()) == sorted(dead.values())
    rows = r.ledger.query("SELECT count(*) FROM failures WHERE action = 'requeue'")[1]
    assert rows == [(requeued,)]
    if r.partner is not None:
        # Every valid msg_id called once (copies in flight together too); the transient
        # one once more where it is retried; poison never reaches the handler.
        ids = {json.loads(b)["msg_id"] for ref, b in MESSAGES if ref not in r.poison}
        want = Counter(dict.fromkeys(ids, 1))
        want[BUSY_ID] += requeued
        assert r.partner.calls == want


def test_poison_is_dead_lettered_with_its_reason_and_never_retried(contract_run: Run) -> None:
    r = contract_run
    dead = {ref: reason for ref, (s, reason) in r.spy.outcomes.items() if s is Settle.DEAD}
    assert {ref: dead[ref] for ref in r.poison} == r.poison
    assert all(r.spy.settled[ref] == 1 for ref in r.poison)
