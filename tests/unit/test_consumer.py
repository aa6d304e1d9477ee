"""The consume loop over the in-memory transport: ordering, dedup, retries, groups."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from onceq._core.consumer import Consumer, Outcome
from onceq._core.transport import Delivery, Kind, Settle
from onceq._ledger.sqlite import Entry, Ledger
from onceq._sources.memory import MemoryTransport
from onceq.errors import LedgerError


def decode(d: Delivery) -> Outcome:
    try:
        doc = json.loads(d.body)
    except ValueError:
        return Outcome(Kind.REJECTED, "parse")
    d.msg_id = doc["id"]
    return Outcome(Kind.SUCCESS, fields={"group": doc.get("kind"), "seq": doc.get("n")})


def msg(msg_id: str, kind: str = "ok", n: int = 1) -> bytes:
    return json.dumps({"id": msg_id, "kind": kind, "n": n}).encode()


class Partner:
    """A handler that behaves by the message's kind and counts calls and concurrency."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: Counter[str] = Counter()
        self.delay = delay
        self.active = 0
        self.max_active = 0

    async def __call__(self, d: Delivery, fields: dict[str, Any]) -> Outcome:
        assert d.msg_id is not None
        self.calls[d.msg_id] += 1
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.active -= 1
        kind = fields["group"]
        if kind == "reject":
            return Outcome(Kind.REJECTED, "http-422")
        if kind == "busy":
            return Outcome(Kind.TRANSIENT, "http-503")
        if kind == "boom":
            raise RuntimeError("bug in handler")
        return Outcome(Kind.SUCCESS, fields=fields)


class CheckingTransport(MemoryTransport):
    """Asserts, at settle time, that each settled outcome is already durable."""

    def __init__(self, ledger_path: Path, deliveries: Sequence[Delivery] = ()) -> None:
        super().__init__(deliveries)
        self.ledger_path = ledger_path
        self.violations: list[str] = []

    async def settle(self, group: Sequence[tuple[Delivery, Settle, str]]) -> None:
        with Ledger(self.ledger_path) as other:  # a separate connection sees only commits
            for d, settle, _reason in group:
                if settle is Settle.ACK and other.processed_ref(d.msg_id or "") is None:
                    self.violations.append(f"ack before record: {d.ref}")
                if settle is not Settle.ACK and other.last_failure(d.ref) is None:
                    self.violations.append(f"{settle.value} before record: {d.ref}")
        await super().settle(group)


def run(transport: MemoryTransport, ledger: Ledger, handler: Partner, **kw: Any) -> Any:
    async def go() -> Any:
        return await Consumer(transport, ledger, decode, handler, **kw).run()

    return asyncio.run(go())


def test_every_outcome_is_recorded_before_it_is_settled(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    t = CheckingTransport(db)
    for i in range(50):
        t.publish(msg(f"m{i}"), ref=f"r{i}")
    t.publish(msg("m3"), ref="copy-of-m3")
    t.publish(b"not json", ref="poison")
    t.publish(msg("x1", "reject"), ref="rej")
    t.publish(msg("x2", "busy"), ref="busy")
    with Ledger(db) as ledger:
        stats = run(t, ledger, Partner(), max_in_flight=8, max_group=4)
        assert t.violations == []
        assert stats.processed == 50 and stats.duplicates == 1
        assert stats.requeued == 1 and stats.dead == 3
        assert sorted(r for d, r in t.dead) == ["http-422", "http-503", "parse"]
        assert ledger.counts()["processed"] == 50


def test_a_transient_failure_is_retried_once_then_dead_lettered(tmp_path: Path) -> None:
    t = MemoryTransport()
    t.publish(msg("b1", "busy"), ref="b1")
    partner = Partner()
    with Ledger(tmp_path / "l.db") as ledger:
        run(t, ledger, partner)
        assert partner.calls["b1"] == 2
        assert [d.redelivered for d in t.requeued] == [False]
        assert [(d.ref, r, d.redelivered) for d, r in t.dead] == [("b1", "http-503", True)]
        assert [(r["attempt"], r["reason"]) for r in ledger.dead_letters()] == [(2, "http-503")]


def test_a_business_rejection_is_never_retried(tmp_path: Path) -> None:
    t = MemoryTransport()
    t.publish(msg("r1", "reject"))
    partner = Partner()
    with Ledger(tmp_path / "l.db") as ledger:
        run(t, ledger, partner)
    assert partner.calls["r1"] == 1
    assert t.requeued == [] and len(t.dead) == 1


def test_a_handler_bug_does_not_lose_the_message(tmp_path: Path) -> None:
    t = MemoryTransport()
    t.publish(msg("e1", "boom"))
    with Ledger(tmp_path / "l.db") as ledger:
        stats = run(t, ledger, Partner())
    assert stats.requeued == 1 and stats.dead == 1
    assert t.dead[0][1] == "internal-error"


def test_a_message_already_in_the_ledger_is_acked_without_a_call(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    partner = Partner()
    with Ledger(db) as ledger:
        first = MemoryTransport()
        first.publish(msg("m1"))
        run(first, ledger, partner)
    with Ledger(db) as ledger:  # a restarted consumer
        again = MemoryTransport()
        again.publish(msg("m1"))
        stats = run(again, ledger, partner)
    assert partner.calls["m1"] == 1
    assert stats.duplicates == 1 and len(again.acked) == 1


def test_copies_in_flight_together_call_the_handler_once(tmp_path: Path) -> None:
    t = MemoryTransport()
    for i in range(5):
        t.publish(msg("same"), ref=f"copy{i}")
    partner = Partner(delay=0.05)
    with Ledger(tmp_path / "l.db") as ledger:
        stats = run(t, ledger, partner, max_in_flight=5)
    assert partner.calls["same"] == 1
    assert stats.processed == 1 and stats.duplicates == 4


def test_handlers_run_concurrently_up_to_the_bound(tmp_path: Path) -> None:
    t = MemoryTransport()
    for i in range(30):
        t.publish(msg(f"m{i}"))
    partner = Partner(delay=0.02)
    with Ledger(tmp_path / "l.db") as ledger:
        run(t, ledger, partner, max_in_flight=5)
    assert partner.max_active == 5


def test_outcomes_share_commits_and_settles(tmp_path: Path) -> None:
    t = MemoryTransport()
    for i in range(1000):
        t.publish(msg(f"m{i}"))
    with Ledger(tmp_path / "l.db") as ledger:
        run(t, ledger, Partner(), max_in_flight=512, max_group=256)
        assert ledger.counts()["processed"] == 1000
    assert sum(t.settle_calls) == 1000
    assert max(t.settle_calls) > 1
    assert len(t.settle_calls) < 100
    assert max(t.settle_calls) <= 256


def test_a_ledger_failure_stops_the_run_and_settles_nothing(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    t = MemoryTransport()
    for i in range(10):
        t.publish(msg(f"m{i}"))
    with Ledger(db) as ledger:
        ledger._write.execute("DROP TABLE messages")  # every SUCCESS insert now fails hard
        ledger._write.execute("DROP TABLE duplicates")
        ledger._write.execute("CREATE TABLE messages (x)")
        with pytest.raises(LedgerError):
            run(t, ledger, Partner())
    assert t.acked == [] and t.dead == [] and t.requeued == []


def test_a_failed_commit_stops_the_run_and_settles_nothing(tmp_path: Path) -> None:
    t = MemoryTransport()
    t.publish(msg("m1"))
    t.publish(b"poison")
    with Ledger(tmp_path / "l.db") as ledger:
        ledger._write.execute("DROP TABLE failures")  # the poison's record cannot be written
        with pytest.raises(LedgerError):
            run(t, ledger, Partner())
        # the group was rolled back as one: m1's row went with the poison's record
        assert ledger.query("SELECT count(*) FROM messages")[1] == [(0,)]
    assert t.acked == [] and t.dead == [] and t.requeued == []


def test_no_new_call_starts_after_a_stop(tmp_path: Path) -> None:
    """A copy waiting behind its in-flight twin when the consumer is stopped (a signal,
    a deadline) is not called: it stays unsettled (a broker returns it when the
    channel closes)."""
    t = MemoryTransport()
    t.publish(msg("twin", "busy"), ref="first")
    t.publish(msg("twin", "busy"), ref="second")
    partner = Partner(delay=0.2)

    async def go() -> None:
        with Ledger(tmp_path / "l.db") as ledger:
            consumer = Consumer(t, ledger, decode, partner, max_in_flight=2)
            run = asyncio.create_task(consumer.run())
            while partner.active == 0:  # the first copy's call is under way
                await asyncio.sleep(0.01)
            consumer.stop()
            await run

    asyncio.run(go())
    assert partner.calls["twin"] == 1
    assert [d.ref for d in t.requeued] == ["first"]  # settled after its failed call
    assert t.acked == [] and t.dead == []  # the second was never settled


def test_partner_duplicates_are_done_and_counted_apart() -> None:
    """A success the partner already had (409) is done, not 'processed', nor a failure."""
    from onceq._cli.output import run_summary
    from onceq._core.consumer import Stats

    def entry(kind: Kind, settle: Settle, **fields: object) -> Entry:
        return Entry(Delivery(b"", "r"), kind, settle, "http-422", fields=dict(fields))

    stats = Stats()
    stats.add(entry(Kind.SUCCESS, Settle.ACK))
    stats.add(entry(Kind.SUCCESS, Settle.ACK, partner_duplicate=True))
    stats.add(entry(Kind.SUCCESS, Settle.ACK, partner_duplicate=True))
    d = stats.as_dict()
    keys = list(d)
    assert keys.index("duplicates") + 1 == keys.index("partner_duplicates")
    assert (d["processed"], d["partner_duplicates"]) == (1, 2)
    merged = Stats()
    merged.merge(d)
    merged.merge({k: v for k, v in d.items() if k != "partner_duplicates"})  # an older report
    assert (merged.processed, merged.partner_duplicates) == (2, 2)
    assert "0 duplicates, 2 partner_duplicates, 0 recovered" in run_summary(stats)[0]
    assert "partner_duplicates" not in run_summary(Stats())[0]  # shown only when there are any
    only = Stats()
    only.add(entry(Kind.REJECTED, Settle.DEAD))
    assert only.all_failed
    only.add(entry(Kind.SUCCESS, Settle.ACK, partner_duplicate=True))
    assert not only.all_failed  # the partner has it: the run did not only fail
