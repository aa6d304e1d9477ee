"""PgGuard's claim + duplicate check in one round trip (`PgGuard(lookup=True)`).

On a real PostgreSQL ledger: a claim answers `Checked(ref)` read AFTER its lock was
granted, so a twin that committed while this claim waited is found as a duplicate;
the read runs with the lock held (proved on the server: the messages table is
swapped for a view whose rows log whether the reading session held the msg_id's
advisory lock at the moment the row was read); SQLite's FileGuard and a guard
without lookup leave the check to the loop (None); a lost guard connection answers
None too (the loop's own read then meets the ledger's state).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest

from onceq._core.inflight import Checked, Leases, guard_for
from onceq._ledger.file_guard import FileGuard
from onceq._ledger.pg import guard as pg_guard
from onceq._ledger.pg.guard import PgGuard
from onceq._ledger.target import open_ledger

pytestmark = pytest.mark.pg

FLOW = "f"

# The probe: `onceq.messages` becomes a view over the real table; reading a row through
# it logs (reader's pid, msg_id, whether that session held the msg_id's advisory lock).
# pg_locks shows an advisory bigint key as classid (high 32 bits) and objid (low 32).
PROBE = """
ALTER TABLE onceq.messages RENAME TO messages_real;
CREATE TABLE onceq.probe (n BIGSERIAL, pid INT, msg_id TEXT, held BOOLEAN);
CREATE FUNCTION onceq.probe(f TEXT, m TEXT) RETURNS BOOLEAN VOLATILE LANGUAGE sql AS $$
    INSERT INTO onceq.probe (pid, msg_id, held) SELECT pg_backend_pid(), m, EXISTS (
        SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
        AND pid = pg_backend_pid() AND objsubid = 1
        AND ((classid::bigint << 32) | objid::bigint) = hashtextextended(f || '/' || m, 0)
    ) RETURNING true
$$;
CREATE VIEW onceq.messages AS
    SELECT * FROM onceq.messages_real WHERE onceq.probe(flow, msg_id);
"""


def commit_row(url: str, msg_id: str, ref: str) -> None:
    """What a twin's commit leaves: its messages row (committed on return)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO onceq.messages_real (flow, msg_id, processed_at, source, ref)"
            " VALUES (%s, %s, '2026-01-01T00:00:00Z', 'mq', %s)",
            (FLOW, msg_id, ref),
        )


def probe_log(url: str, pid: int, msg_id: str) -> list[tuple[str, bool]]:
    """The reads of msg_id's row by the session `pid`, in order (a scan may read other
    rows too: they are not this claim's)."""
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(  # type: ignore[return-value]
            "SELECT msg_id, held FROM onceq.probe WHERE pid = %s AND msg_id = %s ORDER BY n",
            (pid, msg_id),
        ).fetchall()


@pytest.fixture(params=["function", "pipeline"])
def probed(request: pytest.FixtureRequest, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The ledger's schema with the probe; each test runs twice: the batch as the
    session's function (CLAIM_FN), and as the pipeline a server that refuses that
    function gets (no TEMP privilege)."""
    open_ledger(pg_url, "mq", flow=FLOW).close()  # the schema
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(PROBE)
    if request.param == "pipeline":

        async def refused(conn: psycopg.AsyncConnection[object]) -> bool:
            return False

        monkeypatch.setattr(pg_guard, "make_claim_fn", refused)
    return pg_url


async def _pid(g: PgGuard) -> int:
    conn = await g._connection()
    assert conn is not None
    # The way the fixture asked for: the function unless it was refused.
    assert g._fn is (pg_guard.make_claim_fn.__name__ == "make_claim_fn")
    return conn.info.backend_pid


def test_twin_committed_while_waiting_is_found_and_read_under_the_lock(probed: str) -> None:
    async def go() -> None:
        a = PgGuard(probed, FLOW, lookup=True)
        b = PgGuard(probed, FLOW, lookup=True)
        try:
            assert await a.claim("m1") == Checked(None)  # unseen
            waiting = asyncio.create_task(b.claim("m1"))
            await asyncio.sleep(0.3)
            assert not waiting.done(), "b got m1 while a held it"
            # a's call took effect: committed, THEN released (the loop's order).
            commit_row(probed, "m1", "ref-a")
            await a.release("m1")
            assert await asyncio.wait_for(waiting, 3) == Checked("ref-a")
            assert b.waits == 1
            # Every read b made of m1 while a held it was dropped (it asked again);
            # the read that answered it ran with b holding the lock.
            log = probe_log(probed, await _pid(b), "m1")
            assert log, "b never read the ledger"
            assert log[-1] == ("m1", True)
            # An id with a row and a ref of '' (recorded without one).
            commit_row(probed, "m2", "")
            assert await a.claim("m2") == Checked("")
            assert probe_log(probed, await _pid(a), "m2") == [("m2", True)]
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(go())


def test_one_round_trip_answers_a_tick_of_claims(probed: str) -> None:
    commit_row(probed, "seen", "r1")

    async def go() -> None:
        g = PgGuard(probed, FLOW, lookup=True)
        try:
            got = await asyncio.gather(*(g.claim(m) for m in ("seen", "new1", "new2")))
            assert got == [Checked("r1"), Checked(None), Checked(None)]
            assert g.batches == 1
            assert probe_log(probed, await _pid(g), "seen") == [("seen", True)]
        finally:
            await g.aclose()

    asyncio.run(go())


def test_without_lookup_and_on_sqlite_the_loop_checks(pg_url: str, tmp_path: Path) -> None:
    async def go() -> None:
        plain = PgGuard(pg_url, FLOW)  # no schema needed: it reads nothing
        f = FileGuard(tmp_path / "l.db-inflight", FLOW)
        try:
            assert await plain.claim("m") is None
            assert await f.claim("m") is None
        finally:
            await plain.aclose()
            await f.aclose()
        with open_ledger(pg_url, "mq", flow=FLOW) as led:
            g = guard_for(led)
            assert isinstance(g, PgGuard) and g.lookup
            await g.aclose()
        with open_ledger(str(tmp_path / "l.db"), "mq", flow=FLOW) as led:
            leases = Leases()
            leases.open(led)
            assert await leases.claim("m") == (True, None)
            await leases.aclose()

    asyncio.run(go())


def test_lost_guard_connection_leaves_the_check_to_the_loop(probed: str) -> None:
    async def go() -> None:
        g = PgGuard(probed, FLOW, lookup=True)
        try:
            pid = await _pid(g)
            with psycopg.connect(probed, autocommit=True) as conn:
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            # The batch that finds the session gone grants unguarded, unlooked-up.
            assert await g.claim("m1") is None
            assert g.unguarded == 1
        finally:
            await g.aclose()

    asyncio.run(go())


def test_a_session_that_cannot_set_itself_up_grants_unguarded_not_never(
    probed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard's session setup (SET, CREATE FUNCTION in pg_temp) is bounded like its
    queries: a setup that waits (a catalog lock) makes the connection count as away —
    the claim is granted unguarded at once — never a batch whose claims wait for ever."""

    async def stuck(conn: object) -> bool:
        await asyncio.sleep(3600)
        return True

    monkeypatch.setattr(pg_guard, "make_claim_fn", stuck)
    monkeypatch.setattr(pg_guard, "QUERY_TIMEOUT_S", 0.3)

    async def go() -> None:
        g = PgGuard(probed, FLOW, lookup=True)
        try:
            answer = await asyncio.wait_for(g.claim("m1"), 10)
            assert answer is None and g.unguarded == 1
        finally:
            await g.aclose()

    asyncio.run(go())
