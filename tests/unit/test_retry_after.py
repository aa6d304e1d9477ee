"""Retry-After: the header's parsing, `Retry(after=…)` from a Python or SQL effect, and
the retry policy's choice of tier from it (onceq._effects.http, onceq._core.effect)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest

from onceq._core.consumer import Consumer, Outcome
from onceq._core.effect import PythonEffect, Retry, SqlEffect
from onceq._core.retry import RetryPolicy
from onceq._core.transport import Delivery, Kind, Settle
from onceq._effects.http import RETRY_AFTER_CAP, retry_after_seconds
from onceq._ledger.sqlite import Entry, Ledger
from onceq._sources.memory import MemoryTransport

NOW = datetime(2026, 10, 21, 7, 28, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("7", 7.0),
        (" 120 ", 120.0),
        ("1.5", 1.5),  # not RFC, but sent by some servers: honoured
        ("0", None),  # "now": nothing to wait for
        ("-5", None),
        ("soon", None),
        ("", None),
        ("7s", None),
        ("nan", None),
        ("inf", None),
        ("100000", RETRY_AFTER_CAP),
        ("9" * 5000, RETRY_AFTER_CAP),  # no 5000-digit int is made
        ("Wed, 21 Oct 2026 07:28:30 GMT", 30.0),
        ("Wednesday, 21-Oct-26 07:29:00 GMT", 60.0),  # RFC 850, obsolete but allowed
        ("Wed Oct 21 07:28:10 2026", 10.0),  # asctime: no zone, taken as UTC
        ("Wed, 21 Oct 2026 07:27:00 GMT", None),  # past
        ("Wed, 21 Oct 2099 07:28:00 GMT", RETRY_AFTER_CAP),
        ("Wed, 32 Oct 2026 07:28:00 GMT", None),
        (None, None),
    ],
)
def test_retry_after_header(header: str | None, seconds: float | None) -> None:
    assert retry_after_seconds(header, now=NOW) == seconds


def test_a_retry_after_picks_the_first_tier_at_least_that_long() -> None:
    policy = RetryPolicy(immediate=1, delays=(5, 30, 120))
    after = retry_after_seconds("7")
    assert policy.decide(Kind.TRANSIENT, 1, after) == (Settle.DELAY, 30.0)  # no immediate retry
    assert policy.decide(Kind.TRANSIENT, 1, None) == (Settle.REQUEUE, 0.0)
    date = format_datetime(datetime.now(UTC) + timedelta(seconds=100), usegmt=True)
    assert policy.decide(Kind.TRANSIENT, 2, retry_after_seconds(date)) == (Settle.DELAY, 120.0)


def test_retry_takes_an_after() -> None:
    assert Retry("busy").after is None
    assert Retry("busy", after=3).after == 3.0
    assert Retry("busy", after="2m").after == 120.0
    assert Retry("busy", after=0).after is None
    assert Retry("busy", after=10**9).after == RETRY_AFTER_CAP
    assert str(Retry("busy", after=3)) == "busy"
    for bad in (-1, "soon", float("nan"), True):
        with pytest.raises(ValueError, match="Retry after"):
            Retry("busy", after=bad)  # type: ignore[arg-type]


def test_a_python_effects_retry_after_reaches_the_outcome() -> None:
    def handler(doc: dict[str, Any]) -> None:
        raise Retry("rate limited", after=9)

    async def bad(doc: dict[str, Any]) -> None:
        raise Retry("x", after=-1)  # a bug in the handler: its message's, not the run's

    d = Delivery(b"{}", "r", "m")
    out = asyncio.run(PythonEffect(handler)(d, {"doc": {}}))
    assert (out.kind, out.reason, out.retry_after) == (Kind.TRANSIENT, "retry", 9.0)
    out = asyncio.run(PythonEffect(bad)(d, {"doc": {}}))
    assert (out.kind, out.reason, out.retry_after) == (Kind.TRANSIENT, "internal-error", None)


def test_the_loop_waits_the_tier_a_python_retry_after_chose(tmp_path: Path) -> None:
    """1 immediate retry and tiers 0.1 s, 0.6 s: Retry(after=0.5) on the first try skips
    the immediate retry and the 0.1 s tier, so the second call comes >= 0.6 s later."""
    calls: list[float] = []

    def decode(d: Delivery) -> Outcome:
        d.msg_id = json.loads(d.body)["id"]
        return Outcome(Kind.SUCCESS, fields={"doc": {}})

    async def handler(doc: dict[str, Any]) -> None:
        calls.append(asyncio.get_running_loop().time())
        if len(calls) == 1:
            raise Retry("slow down", after=0.5)

    async def main(ledger: Ledger) -> MemoryTransport:
        t = MemoryTransport()
        t.publish(b'{"id": "m1"}', ref="r1")
        policy = RetryPolicy(immediate=1, delays=(0.1, 0.6))
        await Consumer(t, ledger, decode, PythonEffect(handler), retry=policy).run()
        return t

    with Ledger(tmp_path / "l.db") as ledger:
        t = asyncio.run(main(ledger))
        rows = ledger.query("SELECT action, delay_s, reason FROM failures")[1]
    assert [delay for _, delay in t.delayed] == [0.6] and t.requeued == []
    assert len(calls) == 2 and calls[1] - calls[0] >= 0.6 - 0.02  # the timer's granularity
    assert len(t.acked) == 1 and rows == [("delay", 0.6, "retry")]


def test_an_sql_effects_retry_after_chooses_the_tier(tmp_path: Path) -> None:
    def write(tx: Any, doc: dict[str, Any]) -> None:
        raise Retry("locked elsewhere", after="1m") if doc.get("wait") else Retry("locked")

    def entry(msg_id: str, doc: dict[str, Any]) -> Entry:
        d = Delivery(b"{}", f"{msg_id}.json", msg_id)
        e = Entry(d, Kind.SUCCESS, Settle.ACK, fields={"doc": doc})
        e.policy = RetryPolicy(immediate=1, delays=(5, 60, 600))
        return e

    with Ledger(tmp_path / "l.db", sql=SqlEffect(function=write)) as ledger:
        waits, plain = entry("m1", {"wait": True}), entry("m2", {})
        ledger.commit([waits, plain])
        rows = ledger.query("SELECT msg_id, action, delay_s FROM failures ORDER BY id")[1]
    assert (waits.kind, waits.settle, waits.delivery.delay) == (Kind.TRANSIENT, Settle.DELAY, 60)
    assert (plain.settle, plain.delivery.delay) == (Settle.REQUEUE, 0.0)  # its immediate retry
    assert rows == [("m1", "delay", 60.0), ("m2", "requeue", None)]
