"""The consume loop with a circuit breaker, over the in-memory transport.

An outage of N failing calls opens the breaker after K; the held copies go back to
the queue (RELEASE) with no failures row and no attempt spent; the paused transport
hands out one probe at a time, at growing intervals; a success closes it and every
message is processed once. A transport without pause/probe/resume keeps its copies
waiting in the loop instead. An open breaker costs no CPU, and a stop does not wait
for a probe.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from onceq._core.consumer import Consumer, Outcome, no_effect
from onceq._core.retry import BreakerPolicy, RetryPolicy
from onceq._core.transport import Delivery, Kind
from onceq._ledger.sqlite import Ledger
from onceq._sources.memory import MemoryTransport
from support import open_db


def decode(d: Delivery) -> Outcome:
    doc = json.loads(d.body)
    d.msg_id = doc["id"]
    return Outcome(Kind.SUCCESS, fields={"kind": doc.get("kind", "ok")})


def fill(t: MemoryTransport, n: int, kind: str = "ok") -> None:
    for i in range(n):
        t.publish(json.dumps({"id": f"m{i:04d}", "kind": kind}).encode(), ref=f"r{i}")


class Down:
    """A partner whose first `failing` calls fail (connect-error), or while `down` is set.

    Records each call: (time, msg_id, breaker state, calls active when it began).
    """

    def __init__(self, failing: int = 0) -> None:
        self.failing = failing
        self.down = False
        self.consumer: Consumer | None = None
        self.calls: list[tuple[float, str, str, int]] = []
        self.ok: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.active = 0

    async def __call__(self, d: Delivery, fields: dict[str, Any]) -> Outcome:
        assert d.msg_id is not None and self.consumer is not None
        b = self.consumer.breaker
        self.calls.append((time.monotonic(), d.msg_id, b.state if b else "-", self.active))
        self.active += 1
        try:
            await asyncio.sleep(0)
        finally:
            self.active -= 1
        if self.down or len(self.calls) <= self.failing or fields["kind"] == "busy":
            self.failed[d.msg_id] += 1
            return Outcome(
                Kind.TRANSIENT, "http-503" if fields["kind"] == "busy" else "connect-error"
            )
        self.ok[d.msg_id] += 1
        return Outcome(Kind.SUCCESS)


class Plain(MemoryTransport):
    """The in-memory queue without pause/probe/resume (a transport that cannot pause)."""

    pause = probe = resume = None  # type: ignore[assignment]


def consumer(t: MemoryTransport, ledger: Ledger, partner: Down, **kw: Any) -> Consumer:
    c = Consumer(t, ledger, decode, partner, **kw)
    partner.consumer = c
    return c


def failure_rows(db: Path) -> Counter[str]:
    with open_db(db) as conn:
        return Counter(r[0] for r in conn.execute("SELECT msg_id FROM failures"))


def test_an_outage_opens_after_k_holds_without_attempts_probes_growing_then_drains(
    tmp_path: Path,
) -> None:
    db = tmp_path / "l.db"
    t = MemoryTransport()
    fill(t, 40)
    partner = Down(failing=8)
    retry = RetryPolicy(immediate=1, delays=(0.05, 0.1))
    brk = BreakerPolicy(failures=3, probe=0.1, max_probe=0.3)
    with Ledger(db) as ledger:
        c = consumer(t, ledger, partner, max_in_flight=4, retry=retry, breaker=brk)
        stats = asyncio.run(asyncio.wait_for(c.run(), 30))
        assert c.breaker is not None and c.breaker.state == "closed"
        assert c.breaker.opened == 1 and t.pauses == 1
    # Everything processed exactly once, nothing dead (no message failed 4 times).
    assert partner.ok == Counter({f"m{i:04d}": 1 for i in range(40)})
    assert t.dead == [] and stats.dead == 0 and stats.processed == 40
    # Held copies were released untried: no failures row beyond the calls that failed,
    # so no attempt was spent on them.
    assert stats.held == len(t.released) > 0
    assert failure_rows(db) == partner.failed
    # The first 4 calls ran together (in flight when it opened); after that, while not
    # closed, only the probe: one call at a time, each alone.
    probes = [(at, active) for at, _, state, active in partner.calls if state == "half-open"]
    assert [active for _, active in probes] == [0] * len(probes)
    # Calls 5-8 fail as probes, call 9 (a probe) succeeds: 5 probes, 0.1·2^k capped at 0.3.
    assert len(probes) == 5
    opened_at = partner.calls[3][0]  # the 4th call had begun before it opened
    times = [at for at, _ in probes]
    gaps = [b - a for a, b in zip([opened_at, *times[:-1]], times, strict=True)]
    for gap, want in zip(gaps, [0.1, 0.2, 0.3, 0.3, 0.3], strict=True):
        assert want * 0.9 <= gap < want + 2.0, gaps  # timers never fire early; slack up


def test_the_probe_spends_an_attempt_so_a_message_that_always_fails_ends_dead(
    tmp_path: Path,
) -> None:
    db = tmp_path / "l.db"
    t = MemoryTransport()
    fill(t, 1, kind="busy")
    partner = Down()
    retry = RetryPolicy(immediate=0, delays=(0.05, 0.1))
    with Ledger(db) as ledger:
        c = consumer(t, ledger, partner, retry=retry, breaker=BreakerPolicy(failures=1, probe=0.05))
        stats = asyncio.run(asyncio.wait_for(c.run(), 20))
        # Were the probe free, the breaker would probe with it for ever (a timeout here).
        assert partner.failed == Counter({"m0000": 3}) and stats.dead == 1
        assert [r["attempt"] for r in ledger.dead_letters()] == [3]


def test_an_open_breaker_costs_no_cpu_and_makes_no_storm(tmp_path: Path) -> None:
    t = MemoryTransport()
    fill(t, 2000)
    partner = Down()
    partner.down = True

    async def go() -> tuple[float, float]:
        with Ledger(tmp_path / "l.db") as ledger:
            c = consumer(
                t,
                ledger,
                partner,
                max_in_flight=8,
                breaker=BreakerPolicy(failures=5, probe=0.2, max_probe=1),
            )
            task = asyncio.create_task(c.run())
            while c.breaker is None or c.breaker.state == "closed":
                await asyncio.sleep(0.01)
            cpu0, wall0 = time.process_time(), time.monotonic()
            await asyncio.sleep(2.0)
            cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
            c.stop()
            await asyncio.wait_for(task, 10)
            return cpu, wall

    cpu, wall = asyncio.run(go())
    assert cpu < 0.05 * wall, (cpu, wall)
    # 2000 queued, open for 2 s: the 8 calls in flight when it opened, then a probe
    # at 0.2, 0.6, 1.4 (and maybe 2.4) s: no storm of calls, nothing redelivered.
    assert 8 < len(partner.calls) <= 8 + 5, len(partner.calls)
    assert len(t.released) <= 8 + 5


@pytest.mark.parametrize("transport", [MemoryTransport, Plain])
def test_a_stop_while_open_does_not_wait_for_the_probe(
    tmp_path: Path, transport: type[MemoryTransport]
) -> None:
    t = transport()
    fill(t, 20)
    partner = Down()
    partner.down = True

    async def go() -> float:
        with Ledger(tmp_path / "l.db") as ledger:
            c = consumer(
                t,
                ledger,
                partner,
                max_in_flight=8,
                breaker=BreakerPolicy(failures=2, probe=60, max_probe=60),
            )
            task = asyncio.create_task(c.run())
            while c.breaker is None or c.breaker.state == "closed":
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # held copies released (or waiting in the loop)
            t0 = time.monotonic()
            c.stop()
            await asyncio.wait_for(task, 10)
            return time.monotonic() - t0

    assert asyncio.run(go()) < 1.0
    assert len(partner.calls) == 8  # those in flight when it opened; no probe was due


def test_no_breaker_when_off_or_without_a_call(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        t = MemoryTransport()
        assert Consumer(t, ledger, decode, Down(), breaker=BreakerPolicy.off()).breaker is None
        assert Consumer(t, ledger, decode, Down()).breaker is None  # the default: off
        assert Consumer(t, ledger, decode, no_effect, breaker=BreakerPolicy()).breaker is None
        b = Consumer(t, ledger, decode, Down(), breaker=BreakerPolicy()).breaker
        assert b is not None and b.state == "closed" and b.name == ledger.flow


@pytest.mark.parametrize("transport", [MemoryTransport, Plain])
def test_without_an_outage_the_breaker_changes_nothing(
    tmp_path: Path, transport: type[MemoryTransport]
) -> None:
    t = transport()
    fill(t, 50)
    partner = Down()
    with Ledger(tmp_path / "l.db") as ledger:
        c = consumer(t, ledger, partner, breaker=BreakerPolicy())
        stats = asyncio.run(c.run())
    assert stats.processed == 50 and stats.held == 0 and t.released == []
    assert c.breaker is not None and c.breaker.opened == 0 and t.pauses == 0
