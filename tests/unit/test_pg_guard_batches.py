"""PgGuard's round trips: a release rides with the next claim batch.

A copy's release comes when it is settled; the next delivery's claim comes a broker
round trip later, never in the same tick, so an unlock sent at once was a round trip
of its own for every message. It now waits up to RELEASE_WAIT_S for a claim batch
to go out with (unlock first, in the same query), and goes alone only when none comes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest

from onceq._ledger.pg import guard as pg_guard
from onceq._ledger.pg.guard import PgGuard

pytestmark = pytest.mark.pg


def _record_sends(g: PgGuard) -> list[tuple[list[str], list[str]]]:
    """Every query the guard sends: (ids released, ids claimed)."""
    sent: list[tuple[list[str], list[str]]] = []
    real = g._send

    async def send(conn: Any, releases: list[str], claims: list[Any]) -> Any:
        sent.append((list(releases), [m for m, _ in claims]))
        return await real(conn, releases, claims)

    g._send = send  # type: ignore[method-assign]
    return sent


def _held(url: str, key: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (key,)
        ).fetchone()
        return not (row and row[0])  # closing the session drops a lock it took


def test_a_release_goes_out_with_the_next_claim(pg_url: str) -> None:
    async def main() -> None:
        g = PgGuard(pg_url, "f")
        sent = _record_sends(g)
        try:
            await g.claim("m1")
            await g.release("m1")
            await asyncio.sleep(0)  # a tick: the release alone does not go
            await g.claim("m2")
            assert sent == [([], ["m1"]), (["m1"], ["m2"])]
            assert not _held(pg_url, "f/m1") and _held(pg_url, "f/m2")
        finally:
            await g.aclose()

    asyncio.run(main())


def test_a_release_with_no_claim_after_it_goes_alone_soon(pg_url: str) -> None:
    async def main() -> None:
        g = PgGuard(pg_url, "f")
        sent = _record_sends(g)
        try:
            await g.claim("m1")
            t0 = time.monotonic()
            await g.release("m1")
            while len(sent) < 2:
                assert time.monotonic() - t0 < 2.0, sent
                await asyncio.sleep(0.001)
            assert time.monotonic() - t0 >= pg_guard.RELEASE_WAIT_S * 0.9
            assert sent == [([], ["m1"]), (["m1"], [])]
            await asyncio.sleep(0.05)  # its answer
            assert not _held(pg_url, "f/m1")
        finally:
            await g.aclose()

    asyncio.run(main())


def test_closing_with_a_release_pending_frees_the_lock(pg_url: str) -> None:
    async def main() -> None:
        g = PgGuard(pg_url, "f")
        sent = _record_sends(g)
        await g.claim("m1")
        await g.release("m1")
        await g.aclose()  # the session goes, and its locks with it
        await asyncio.sleep(pg_guard.RELEASE_WAIT_S * 3)
        assert sent == [([], ["m1"])]  # nothing sent after the close
        assert not _held(pg_url, "f/m1")

    asyncio.run(main())
