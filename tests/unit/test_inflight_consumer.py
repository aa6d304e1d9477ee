"""The consume loop with the in-flight guard and a ledger that goes away.

Two consumers on one ledger (SQLite file and PostgreSQL) with twins of every message:
the partner is called once per message with the guard, and twice without it (the
control: the test would fail if the guard did not work). The steps run in the
documented order: turn → claim → duplicate check → call → commit → settle → release.
A stop cuts a wait for a twin elsewhere short (no call, the copy unsettled). A ledger
whose reads raise LedgerUnavailable: copies HELD untried, the transport paused once
(no redelivery storm), resumed when ping() answers, everything then recorded once; a
failure whose attempts cannot be counted is held, not decided; a transport that cannot
pause keeps its copies waiting instead; stop() interrupts the ledger.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from onceq._core.consumer import Consumer, Outcome
from onceq._core.entry import Entry
from onceq._core.inflight import guard_for
from onceq._core.retry import RetryPolicy
from onceq._core.transport import Delivery, Kind, Settle
from onceq._ledger.file_guard import FileGuard
from onceq._ledger.target import open_ledger
from onceq._sources.memory import MemoryTransport
from onceq.errors import LedgerUnavailable

N = 30


def decode(d: Delivery) -> Outcome:
    doc = json.loads(d.body)
    d.msg_id = doc["id"]
    return Outcome(Kind.SUCCESS, fields={"kind": doc.get("kind", "ok")})


def fill(t: MemoryTransport, n: int, kind: str = "ok") -> None:
    for i in range(n):
        t.publish(json.dumps({"id": f"m{i:03d}", "kind": kind}).encode(), ref=f"r{i}")


class Partner:
    """Counts calls per msg_id; each call takes `delay` seconds."""

    def __init__(self, delay: float = 0.05, log: list[tuple[str, str]] | None = None) -> None:
        self.delay = delay
        self.calls: Counter[str] = Counter()
        self.log = log

    async def __call__(self, d: Delivery, fields: dict[str, Any]) -> Outcome:
        assert d.msg_id is not None
        self.calls[d.msg_id] += 1
        if self.log is not None:
            self.log.append(("call", d.msg_id))
        await asyncio.sleep(self.delay)
        if fields["kind"] == "fail":
            return Outcome(Kind.TRANSIENT, "http-503")
        return Outcome(Kind.SUCCESS)


def _twins(target: str, guarded: bool) -> tuple[Partner, list[Any]]:
    partner = Partner()
    ledgers = [open_ledger(target, "amqp") for _ in range(2)]
    ts = [MemoryTransport() for _ in range(2)]
    for t in ts:
        fill(t, N)
    make = guard_for if guarded else (lambda _ledger: None)
    cs = [
        Consumer(t, led, decode, partner, inflight=make) for t, led in zip(ts, ledgers, strict=True)
    ]

    async def main() -> list[Any]:
        return list(await asyncio.gather(*(c.run() for c in cs)))

    try:
        stats = asyncio.run(asyncio.wait_for(main(), 30))
        assert ledgers[0].counts()["processed"] == N
    finally:
        for led in ledgers:
            led.close()
    return partner, stats


def test_twins_in_two_consumers_call_the_partner_once(ledger_target: str) -> None:
    partner, stats = _twins(ledger_target, guarded=True)
    assert partner.calls == Counter({f"m{i:03d}": 1 for i in range(N)})
    assert sum(s.processed for s in stats) == N and sum(s.duplicates for s in stats) == N


def test_without_the_guard_the_same_twins_call_twice(ledger_target: str) -> None:
    """The control: what the test above would see if the guard did nothing."""
    partner, stats = _twins(ledger_target, guarded=False)
    assert sum(partner.calls.values()) > N
    assert sum(s.processed for s in stats) == N  # the primary key still records once


class SpyGuard:
    def __init__(self, log: list[tuple[str, str]]) -> None:
        self.log = log
        self.closed = False

    async def claim(self, msg_id: str) -> None:
        self.log.append(("claim", msg_id))

    async def release(self, msg_id: str) -> None:
        self.log.append(("release", msg_id))

    async def aclose(self) -> None:
        self.closed = True


class SpyTransport(MemoryTransport):
    def __init__(self, log: list[tuple[str, str]]) -> None:
        super().__init__()
        self.log = log

    async def settle(self, group: Sequence[tuple[Delivery, Settle, str]]) -> None:
        self.log.extend(("settle", d.msg_id or "") for d, _, _ in group)
        await super().settle(group)


def test_the_steps_run_in_the_documented_order(tmp_path: Path) -> None:
    log: list[tuple[str, str]] = []
    t = SpyTransport(log)
    fill(t, 5)
    t.publish(json.dumps({"id": "m000"}).encode(), ref="twin")  # a twin: a duplicate
    guard = SpyGuard(log)
    with open_ledger(tmp_path / "l.db", "amqp") as led:
        real = led.processed_ref

        def processed_ref(msg_id: str) -> str | None:
            log.append(("check", msg_id))
            return real(msg_id)

        real_many = led.processed_refs

        def processed_refs(msg_ids: Iterable[str]) -> dict[str, str]:
            # The loop reads one tick's ids at once (Ledger.aprocessed_ref): each one's check.
            msg_ids = list(msg_ids)
            log.extend(("check", m) for m in msg_ids)
            return real_many(msg_ids)

        led.processed_ref = processed_ref  # type: ignore[method-assign]
        led.processed_refs = processed_refs  # type: ignore[method-assign]
        c = Consumer(t, led, decode, Partner(0.01, log), inflight=lambda _: guard)
        stats = asyncio.run(c.run())
    assert guard.closed and stats.processed == 5 and stats.duplicates == 1
    for i in range(5):
        m = f"m{i:03d}"
        steps = [s for s, x in log if x == m]
        if m == "m000":
            # The first copy's five steps, then the twin's: its turn came after the
            # first released, and the check found the row (no call).
            assert steps == ["claim", "check", "call", "settle", "release"] * 1 + [
                "claim", "check", "settle", "release",
            ]  # fmt: skip
        else:
            assert steps == ["claim", "check", "call", "settle", "release"], (m, steps)


def test_a_stop_cuts_a_wait_for_a_twin_elsewhere_short(tmp_path: Path) -> None:
    lock = tmp_path / "l.db-inflight"
    partner = Partner(0.0)
    t = MemoryTransport()
    fill(t, 1)

    async def main() -> tuple[Any, float]:
        elsewhere = FileGuard(lock, "default")  # the twin's process (same lock space)
        await elsewhere.claim("m000")
        with open_ledger(tmp_path / "l.db", "amqp") as led:
            c = Consumer(t, led, decode, partner)
            run = asyncio.create_task(c.run())
            await asyncio.sleep(0.5)
            assert not run.done()  # waiting for the lease
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            c.stop()
            stats = await asyncio.wait_for(run, 5)
            took = loop.time() - t0
        await elsewhere.aclose()
        return stats, took

    stats, took = asyncio.run(main())
    assert took < 0.5
    assert partner.calls == Counter() and stats.processed == 0
    assert t.acked == [] and t.released == []  # unsettled: the broker returns it


def test_a_stop_while_the_check_is_answered_starts_no_call(tmp_path: Path) -> None:
    """A ledger read through its tick's batch (PostgreSQL's; SQLite's when no FileGuard
    stands beside it) answers a moment later: a stop in that moment must still start
    no call, and leave the copy unsettled (the broker returns it)."""
    partner = Partner(0.0)
    t = MemoryTransport()
    fill(t, 1)

    with open_ledger(tmp_path / "l.db", "amqp") as led:
        asked = asyncio.Event()
        answer = asyncio.Event()
        real = led.aprocessed_ref

        async def aprocessed_ref(msg_id: str) -> str | None:
            asked.set()
            await answer.wait()  # the tick's read, still to come
            return await real(msg_id)

        led.aprocessed_ref = aprocessed_ref  # type: ignore[method-assign]

        async def main() -> Any:
            # No guard: the check goes through aprocessed_ref (a FileGuard's is read at once).
            c = Consumer(t, led, decode, partner, inflight=lambda _: None)
            run = asyncio.create_task(c.run())
            await asyncio.wait_for(asked.wait(), 5)
            c.stop()
            answer.set()
            return await asyncio.wait_for(run, 5)

        stats = asyncio.run(main())
    assert partner.calls == Counter() and stats.processed == 0
    assert t.acked == [] and t.released == []


def test_beside_a_file_guard_the_check_is_the_ticks_read_made_under_the_lease(
    tmp_path: Path,
) -> None:
    """SQLite with its FileGuard: each copy's check is the ledger's read of its tick
    (`aprocessed_ref`: one read for the copies started in one tick), made while every
    one of them holds its lease (a row a twin elsewhere committed before is found)."""
    partner = Partner(0.0)
    t = MemoryTransport()
    fill(t, 3)
    path = tmp_path / "l.db"
    with open_ledger(path, "amqp") as led, open_ledger(path, "amqp") as elsewhere:
        d = Delivery(body=b"{}", ref="theirs", msg_id="m001", stable_ref=True)
        elsewhere.commit([Entry(d, Kind.SUCCESS, Settle.ACK, fields={"kind": "ok"})])
        checked: list[tuple[str, bool]] = []
        reads: list[list[str]] = []
        one, many = led.processed_ref, led.processed_refs
        c = Consumer(t, led, decode, partner)

        def held(ids: list[str]) -> None:
            guard = c.leases.guard
            assert isinstance(guard, FileGuard)
            reads.append(ids)
            checked.extend((m, m in guard._mine) for m in ids)  # its lease held then

        def processed_ref(msg_id: str) -> str | None:
            held([msg_id])
            return one(msg_id)

        def processed_refs(msg_ids: Any) -> dict[str, str]:
            ids = list(msg_ids)
            held(ids)
            return many(ids)

        led.processed_ref = processed_ref  # type: ignore[method-assign]
        led.processed_refs = processed_refs  # type: ignore[method-assign]
        stats = asyncio.run(c.run())
    assert sorted(checked) == [("m000", True), ("m001", True), ("m002", True)]
    assert reads == [["m000", "m001", "m002"]]  # one tick, one read
    assert stats.processed == 2 and stats.duplicates == 1
    assert partner.calls == Counter({"m000": 1, "m002": 1})


class AwayLedger:
    """A real ledger whose reads raise LedgerUnavailable while `away` is set."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.away = False
        self.reads_while_away = 0
        self.pings = 0
        self.interrupted = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _read(self) -> None:
        if self.away:
            self.reads_while_away += 1
            raise LedgerUnavailable("ledger: the ledger's database is unavailable")

    def processed_ref(self, msg_id: str) -> str | None:
        self._read()
        return self.inner.processed_ref(msg_id)

    async def aprocessed_ref(self, msg_id: str) -> str | None:
        return self.processed_ref(msg_id)

    def failed_attempts(self, msg_id: str) -> int:
        self._read()
        return self.inner.failed_attempts(msg_id)

    def ping(self) -> bool:
        self.pings += 1
        return not self.away

    def interrupt(self) -> None:
        self.interrupted = True


def _away_for(led: AwayLedger, seconds: float) -> None:
    led.away = True
    asyncio.get_running_loop().call_later(seconds, setattr, led, "away", False)


def test_a_lost_ledger_holds_copies_pauses_once_and_resumes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    t = MemoryTransport()
    fill(t, 40)
    partner = Partner(0.01)
    with open_ledger(tmp_path / "l.db", "amqp") as inner:
        led = AwayLedger(inner)
        c = Consumer(t, led, decode, partner, max_in_flight=8)

        async def main() -> Any:
            _away_for(led, 1.5)
            return await asyncio.wait_for(c.run(), 20)

        stats = asyncio.run(main())
        assert inner.counts()["processed"] == 40 and inner.counts()["failures"] == 0
    # Nothing was called while it was away, and each message once in all.
    assert partner.calls == Counter({f"m{i:03d}": 1 for i in range(40)})
    # Paused once: the copies in flight were held (at most max_in_flight of them, plus
    # the one the loop had taken and waited for a slot with), then nothing more came
    # until ping() answered: no redelivery storm.
    assert t.pauses == 1 and not t.paused
    assert 1 <= stats.held == len(t.released) <= 8 + 1
    assert led.reads_while_away == stats.held
    assert 2 <= led.pings <= 5  # every 0.5 s for 1.5 s
    assert c.holds.ledger_losses == 1
    text = caplog.text
    assert text.count("unavailable (LedgerUnavailable); holding") == 1
    assert text.count("answers again after") == 1


def test_a_failure_whose_attempts_cannot_be_counted_is_held_not_decided(tmp_path: Path) -> None:
    t = MemoryTransport()
    fill(t, 1, kind="fail")
    partner = Partner(0.0)
    with open_ledger(tmp_path / "l.db", "amqp") as inner:
        led = AwayLedger(inner)
        real_call = partner.__call__

        async def handler(d: Delivery, fields: dict[str, Any]) -> Outcome:
            out = await real_call(d, fields)
            if partner.calls[d.msg_id or ""] == 1:
                _away_for(led, 0.6)  # gone between the call and its attempt count
            return out

        c = Consumer(t, led, decode, handler, retry=RetryPolicy(immediate=1, delays=()))
        stats = asyncio.run(asyncio.wait_for(c.run(), 20))
        # Held once (no row), then called twice more: attempts 1 and 2 recorded, dead.
        assert stats.held == 1 and stats.dead == 1 and partner.calls["m000"] == 3
        assert [r["attempt"] for r in inner.dead_letters()] == [2]


class Plain(MemoryTransport):
    """The in-memory queue without pause/probe/resume."""

    pause = probe = resume = None  # type: ignore[assignment]


def test_a_transport_that_cannot_pause_keeps_its_copies_waiting(tmp_path: Path) -> None:
    t = Plain()
    fill(t, 10)
    partner = Partner(0.0)
    with open_ledger(tmp_path / "l.db", "amqp") as inner:
        led = AwayLedger(inner)
        c = Consumer(t, led, decode, partner, max_in_flight=4)

        async def main() -> Any:
            _away_for(led, 1.0)
            return await asyncio.wait_for(c.run(), 20)

        stats = asyncio.run(main())
    # Not given back (that would be a storm without a pause): they waited, then ran.
    assert stats.held == 0 and t.released == [] and stats.processed == 10
    assert led.reads_while_away <= 4 * 2  # each waiting copy read once, then waited
    assert partner.calls == Counter({f"m{i:03d}": 1 for i in range(10)})


def test_stop_interrupts_the_ledger_and_does_not_wait_for_it(tmp_path: Path) -> None:
    t = MemoryTransport()
    fill(t, 5)
    with open_ledger(tmp_path / "l.db", "amqp") as inner:
        led = AwayLedger(inner)
        c = Consumer(t, led, decode, Partner(0.0))

        async def main() -> Any:
            led.away = True  # and never back
            run = asyncio.create_task(c.run())
            await asyncio.sleep(0.5)
            c.stop()
            return await asyncio.wait_for(run, 3)

        stats = asyncio.run(main())
    assert led.interrupted and stats.processed == 0
