"""One suite, every transport: what the consume loop promises whatever the queue.

Each transport is driven through the same `Consumer` with the same messages:
distinct ones, re-sent copies (some in flight together), and poison. The suite
checks the promises, not the mechanics: every copy settled exactly once, each
settle only after its record is durable, one ledger row per msg_id, poison
dead-lettered with its reason. The RabbitMQ transport joins this suite in
tests/integration (it needs the broker); the checks are the ones defined here.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from onceq.consumer import Consumer, Outcome
from onceq.dirq.message import MessageSpec, decode
from onceq.dirq.queue import DirQueue, Worker, write_atomic
from onceq.ledger import Ledger
from onceq.memory import MemoryTransport
from onceq.transport import Delivery, Settle, Transport


@dataclass
class Spy:
    """Wraps a transport; records what is settled and checks it was durable first."""

    inner: Transport
    ledger_path: Path
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
                self.settled[d.ref] += 1
                self.outcomes[d.ref] = (settle, reason)
                if settle is Settle.ACK and other.processed_ref(d.msg_id or "") is None:
                    self.violations.append(f"{d.ref}: acked before its row was durable")
                if settle is Settle.DEAD and other.last_failure(d.ref) is None:
                    self.violations.append(f"{d.ref}: dead-lettered before its failure row")
        await self.inner.settle(group)


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
POISON = {"msg-104.json": "parse", "msg-105.json": "missing-field"}


def memory_transport(tmp_path: Path) -> tuple[Transport, Callable[[], None]]:
    t = MemoryTransport(Delivery(body=b, ref=ref) for ref, b in MESSAGES)
    return t, lambda: None


def dirq_transport(tmp_path: Path) -> tuple[Transport, Callable[[], None]]:
    q = DirQueue(tmp_path / "q")
    q.init()
    for ref, body in MESSAGES:
        write_atomic(q.folder("inbox"), ref, body)
    w = Worker(q, MessageSpec().max_bytes).open()
    return w, w.close


TRANSPORTS = {"memory": memory_transport, "dirq": dirq_transport}


@pytest.fixture(params=sorted(TRANSPORTS))
def contract_run(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Spy, Ledger, Any]:
    transport, close = TRANSPORTS[request.param](tmp_path)
    db = tmp_path / "ledger.db"
    ledger = Ledger(db)
    spy = Spy(transport, db)
    spec = MessageSpec()

    async def go() -> Any:
        def dec(d: Delivery) -> Outcome:
            return decode(d, spec)

        return await Consumer(spy, ledger, dec, max_in_flight=8, max_group=5, max_attempts=1).run()

    try:
        stats = asyncio.run(go())
    finally:
        close()
    yield spy, ledger, stats
    ledger.close()


def test_every_copy_is_settled_exactly_once(contract_run: tuple[Spy, Ledger, Any]) -> None:
    spy, _, stats = contract_run
    assert sorted(spy.settled) == sorted(ref for ref, _ in MESSAGES)
    assert set(spy.settled.values()) == {1}
    assert stats.received == len(MESSAGES)


def test_nothing_is_settled_before_its_record_is_durable(
    contract_run: tuple[Spy, Ledger, Any],
) -> None:
    spy, _, _ = contract_run
    assert spy.violations == []


def test_one_row_per_msg_id_and_copies_are_duplicates(
    contract_run: tuple[Spy, Ledger, Any],
) -> None:
    spy, ledger, stats = contract_run
    assert ledger.counts()["processed"] == UNIQUE
    assert stats.processed == UNIQUE and stats.duplicates == 4
    assert ledger.duplicate_ids() == ["m-0005", "m-0017"]
    acked = [ref for ref, (s, _) in spy.outcomes.items() if s is Settle.ACK]
    assert len(acked) == len(MESSAGES) - len(POISON)


def test_poison_is_dead_lettered_with_its_reason_and_never_retried(
    contract_run: tuple[Spy, Ledger, Any],
) -> None:
    spy, ledger, stats = contract_run
    dead = {ref: reason for ref, (s, reason) in spy.outcomes.items() if s is Settle.DEAD}
    assert dead == POISON
    assert stats.requeued == 0
    assert {r["ref"]: r["reason"] for r in ledger.dead_letters()} == POISON
