"""Retry-After from a real HTTP server (aiohttp, in the test): the header becomes
Outcome.retry_after, and through the consume loop the retry policy waits the tier it
chose. The server answers what each test scripts, per request, and records when."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from onceq._core.consumer import Consumer
from onceq._core.message import MessageSpec
from onceq._core.retry import RetryPolicy
from onceq._core.transport import Delivery, Kind, Settle
from onceq._effects.http import RETRY_AFTER_CAP, HttpEffect
from onceq._ledger.sqlite import Ledger
from onceq._sources.memory import MemoryTransport

SPEC = MessageSpec(id_field="id")


@asynccontextmanager
async def scripted(answers: list[tuple[int, dict[str, str]]]) -> AsyncIterator[tuple[str, list]]:
    """Answer the n-th request with answers[n] (status, headers); the last one after.
    Yields (url, the loop times the requests came in)."""
    times: list[float] = []

    async def handle(request: web.Request) -> web.Response:
        times.append(asyncio.get_running_loop().time())
        status, headers = answers[min(len(times), len(answers)) - 1]
        return web.Response(status=status, headers=headers, text="busy" if status >= 400 else "")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/api", times
    finally:
        await runner.cleanup()


def one_call(status: int, headers: dict[str, str]) -> Any:
    async def main() -> Any:
        async with scripted([(status, headers)]) as (url, _):
            effect = HttpEffect(url)
            try:
                d = Delivery(b'{"id": "m1"}', "r", headers={})
                return await effect(d, SPEC.decode(d).fields)
            finally:
                await effect.aclose()

    return asyncio.run(main())


@pytest.mark.parametrize(
    ("status", "header", "after"),
    [
        (503, "7", 7.0),
        (429, "30", 30.0),
        (500, "120", 120.0),
        (503, "nonsense", None),
        (503, "-3", None),
        (503, "999999", RETRY_AFTER_CAP),
        (422, "7", None),  # a rejection is dead whatever it asks
    ],
)
def test_the_header_becomes_the_outcomes_retry_after(
    status: int, header: str, after: float | None
) -> None:
    out = one_call(status, {"Retry-After": header})
    assert out.reason == f"http-{status}"
    assert out.kind is (Kind.REJECTED if status == 422 else Kind.TRANSIENT)
    assert out.retry_after == after


def test_an_http_date_is_the_wait_until_then() -> None:
    when = datetime.now(UTC) + timedelta(seconds=100)
    out = one_call(503, {"Retry-After": format_datetime(when, usegmt=True)})
    # the date has whole seconds (the fraction is cut): 99 < wait <= 100, minus the call
    assert out.retry_after is not None and 97.0 < out.retry_after <= 100.0, out.retry_after
    policy = RetryPolicy(immediate=1, delays=(5, 30, 120, 600))
    assert policy.decide(out.kind, 1, out.retry_after) == (Settle.DELAY, 120.0)


def test_no_header_leaves_the_policy_alone() -> None:
    out = one_call(503, {})
    assert out.retry_after is None
    assert RetryPolicy().decide(out.kind, 1, out.retry_after) == (Settle.REQUEUE, 0.0)


def test_the_loop_waits_at_least_the_partners_retry_after(tmp_path: Path) -> None:
    """Tiers 0.2 s and 1 s after one immediate retry. The partner answers 503 with
    Retry-After: 1, then 201: the immediate retry and the 0.2 s tier are skipped, the
    second call comes >= 1 s after the first, and the ledger says delay 1 s."""

    async def main(ledger: Ledger) -> tuple[MemoryTransport, list[float]]:
        async with scripted([(503, {"Retry-After": "1"}), (201, {})]) as (url, times):
            t = MemoryTransport()
            t.publish(b'{"id": "m1"}', ref="r1")
            effect = HttpEffect(url)
            try:
                policy = RetryPolicy(immediate=1, delays=(0.2, 1.0))
                await Consumer(t, ledger, SPEC.decode, effect, retry=policy).run()
            finally:
                await effect.aclose()
            return t, times

    with Ledger(tmp_path / "l.db") as ledger:
        t, times = asyncio.run(main(ledger))
        rows = ledger.query("SELECT reason, attempt, action, delay_s FROM failures")[1]
        assert ledger.processed_ref("m1") == "r1"
    assert len(times) == 2 and times[1] - times[0] >= 1.0 - 0.02, times  # timer granularity
    assert [delay for _, delay in t.delayed] == [1.0] and t.requeued == []
    assert rows == [("http-503", 1, "delay", 1.0)]
