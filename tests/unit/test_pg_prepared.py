"""A statement psycopg prepares inside a pipeline that fails (`onceq._ledger.pg.pipeline`).

psycopg prepares a text on its sixth run and counts it as prepared once the Parse is
queued. In a pipeline, a statement that fails before it makes the server skip that
Parse, and every later run of the text failed with "prepared statement _pg3_N does
not exist". The ledger's writer (an optimistic insert meeting a redelivered copy) and
the guard's claim pipeline (a server short of lock space) both keep their session
after such a failure, so both must make psycopg forget what it thinks is prepared.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from onceq._ledger.pg import guard as pg_guard
from onceq._ledger.pg.pipeline import forget_prepared, pipeline
from onceq._ledger.target import open_ledger

pytestmark = pytest.mark.pg

TEXT = "SELECT %s::int + 1"


def _runs_before_preparing(conn: psycopg.Connection[Any]) -> None:
    threshold = conn.prepare_threshold
    assert threshold is not None
    for i in range(threshold):
        assert conn.execute(TEXT, (i,)).fetchone() == (i + 1,)


def test_a_text_first_prepared_in_a_failed_pipeline_still_runs_afterwards(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        _runs_before_preparing(conn)
        with pytest.raises(psycopg.errors.DivisionByZero), pipeline(conn):
            conn.execute("SELECT 1/0")
            conn.execute(TEXT, (41,))  # its Parse is skipped by the server
        assert not conn.closed  # a refusal, not a loss: the session is kept
        assert conn.execute(TEXT, (41,)).fetchone() == (42,)
        assert conn.execute(TEXT, (1,)).fetchone() == (2,)


def test_psycopg_still_needs_the_reset(pg_url: str) -> None:
    """The reset is here because psycopg gets it wrong by itself; when a release of
    psycopg stops doing so, this fails, and forget_prepared can go."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        _runs_before_preparing(conn)
        with pytest.raises(psycopg.errors.DivisionByZero), conn.pipeline():
            conn.execute("SELECT 1/0")
            conn.execute(TEXT, (41,))
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            conn.execute(TEXT, (41,))
        assert forget_prepared(conn)
        assert conn.execute(TEXT, (41,)).fetchone() == (42,)


def test_the_guards_lookup_first_prepared_in_a_failed_batch_still_runs(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard's pipelined form (no temporary function on this server): a claim
    refused for lock space is not a lost session, and the lookup queued behind it
    was the one being prepared. The next batches are guarded and looked up as
    before, not the ledger's error."""
    with open_ledger(pg_url):  # the schema the lookup reads
        pass
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION full_lock_table(ids text, flow text) RETURNS SETOF text"
            " LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'out of shared memory'"
            " USING ERRCODE = '53200'; END $$"
        )

    async def no_function(conn: Any) -> bool:
        return False

    monkeypatch.setattr(pg_guard, "make_claim_fn", no_function)
    real_claim = pg_guard.CLAIM_SQL

    async def main() -> None:
        g = pg_guard.PgGuard(pg_url, "f", lookup=True)
        for i in range(5):  # psycopg's threshold: the next lookup is prepared
            await asyncio.wait_for(g.claim(f"m{i}"), 5)
            await g.release(f"m{i}")
        monkeypatch.setattr(pg_guard, "CLAIM_SQL", "SELECT * FROM full_lock_table(%s, %s)")
        await asyncio.wait_for(g.claim("x"), 5)
        assert g.unguarded == 1
        monkeypatch.setattr(pg_guard, "CLAIM_SQL", real_claim)
        for i in range(3):
            answer = await asyncio.wait_for(g.claim(f"n{i}"), 5)
            assert answer is not None  # looked up: no ref recorded for it
            await g.release(f"n{i}")
        assert g.unguarded == 1
        await g.aclose()

    asyncio.run(main())
