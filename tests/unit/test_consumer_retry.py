"""The loop under a retry policy with delayed tiers, over the in-memory transport."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from onceq._core.consumer import Consumer, Outcome
from onceq._core.retry import RetryPolicy
from onceq._core.transport import Delivery, Kind
from onceq._ledger.sqlite import Ledger
from onceq._sources.memory import MemoryTransport


def decode(d: Delivery) -> Outcome:
    doc = json.loads(d.body)
    d.msg_id = doc["id"]
    return Outcome(Kind.SUCCESS, fields={})


class Flaky:
    """Fails each message `fails` times (503, optionally with a Retry-After), then succeeds."""

    def __init__(self, fails: int, retry_after: float | None = None) -> None:
        self.fails = fails
        self.retry_after = retry_after
        self.calls: dict[str, list[float]] = {}

    async def __call__(self, d: Delivery, fields: dict[str, Any]) -> Outcome:
        assert d.msg_id is not None
        times = self.calls.setdefault(d.msg_id, [])
        times.append(time.monotonic())
        if len(times) <= self.fails:
            return Outcome(Kind.TRANSIENT, "http-503", retry_after=self.retry_after)
        return Outcome(Kind.SUCCESS, fields=fields)


def run(tmp_path: Path, handler: Flaky, policy: RetryPolicy, n: int = 3) -> tuple[Any, Ledger]:
    t = MemoryTransport()
    for i in range(n):
        t.publish(json.dumps({"id": f"m{i}"}).encode(), ref=f"r{i}")
    ledger = Ledger(tmp_path / "l.db", "memory")
    stats = asyncio.run(Consumer(t, ledger, decode, handler, retry=policy).run())
    return stats, ledger


def test_two_transient_failures_then_success_take_three_calls_and_the_delays(
    tmp_path: Path,
) -> None:
    handler = Flaky(fails=2)
    stats, ledger = run(tmp_path, handler, RetryPolicy(immediate=0, delays=(0.3, 0.6)))
    assert stats.processed == 3 and stats.dead == 0 and stats.requeued == 6
    for times in handler.calls.values():
        assert len(times) == 3
        assert times[1] - times[0] >= 0.3 - 0.01
        assert times[2] - times[1] >= 0.6 - 0.01
    rows = ledger._rows("SELECT action, count(*) FROM failures GROUP BY action")[1]
    assert dict(rows) == {"delay": 6}


def test_out_of_tiers_is_dead_after_max_attempts(tmp_path: Path) -> None:
    handler = Flaky(fails=99)
    policy = RetryPolicy(immediate=1, delays=(0.1, 0.2))
    stats, ledger = run(tmp_path, handler, policy, n=2)
    assert stats.dead == 2 and stats.processed == 0
    assert all(len(t) == policy.max_attempts == 4 for t in handler.calls.values())
    assert ledger.failed_attempts("m0") == 4


def test_retry_after_waits_at_least_what_the_partner_asked(tmp_path: Path) -> None:
    handler = Flaky(fails=1, retry_after=0.5)
    run(tmp_path, handler, RetryPolicy(immediate=1, delays=(0.1, 0.5, 1.0)), n=1)
    (times,) = handler.calls.values()
    assert len(times) == 2
    # the immediate retry was skipped, and the 0.1 s tier too
    assert times[1] - times[0] >= 0.5 - 0.01
