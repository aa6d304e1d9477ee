"""The in-flight guards themselves (onceq._core.inflight, onceq._ledger.pg.guard), on real locks.

Both kinds: a second holder waits until the first releases; a process killed with
SIGKILL while holding a lease does not block the msg_id (the server / the kernel drops
its locks) and another process claims it within about a second. PostgreSQL: claims of
one tick go out in one query; a lost guard connection lets claims through unguarded
(with one WARNING) instead of blocking the run, and the guard comes back by itself.
SQLite's file: two guards of one process wait for each other too, and closing one
never frees the other's locks (POSIX locks belong to the process).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import psycopg
import pytest

from onceq._core.inflight import InflightGuard, guard_for
from onceq._ledger.file_guard import FileGuard, lock_offset
from onceq._ledger.pg.guard import PgGuard
from onceq._ledger.target import open_ledger

Make = Callable[[], InflightGuard]


@pytest.fixture(params=["file", "postgresql"])
def make_guard(request: pytest.FixtureRequest, tmp_path: Path) -> Make:
    """A factory of guards on ONE lock space (a file, or a database), flow 'f'."""
    if request.param == "file":
        lock = tmp_path / "l.db-inflight"
        return lambda: FileGuard(lock, "f")
    url = request.getfixturevalue("pg_url")
    return lambda: PgGuard(url, "f")


def run(coro: Awaitable[object]) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


async def _held_until_released(a: InflightGuard, b: InflightGuard) -> None:
    await a.claim("m1")
    waiting = asyncio.create_task(b.claim("m1"))
    await asyncio.sleep(0.4)
    assert not waiting.done(), "a second holder got a msg_id that was held"
    await b.claim("m2")  # another id is not held up by it
    t0 = time.monotonic()
    await a.release("m1")
    await asyncio.wait_for(waiting, 2)
    assert time.monotonic() - t0 < 0.5  # polled at 5 ms doubling to 200 ms
    # b holds m1 now: a waits in turn.
    again = asyncio.create_task(a.claim("m1"))
    await asyncio.sleep(0.2)
    assert not again.done()
    await b.release("m1")
    await asyncio.wait_for(again, 2)
    await a.aclose()
    await b.aclose()


def test_a_second_claim_waits_until_the_first_is_released(make_guard: Make) -> None:
    async def main() -> None:
        await _held_until_released(make_guard(), make_guard())

    run(main())


def test_flows_do_not_share_leases(tmp_path: Path, pg_url: str) -> None:
    async def main() -> None:
        for a, b in (
            (FileGuard(tmp_path / "x", "f"), FileGuard(tmp_path / "x", "g")),
            (PgGuard(pg_url, "f"), PgGuard(pg_url, "g")),
        ):
            await a.claim("m1")
            await asyncio.wait_for(b.claim("m1"), 1)
            await a.aclose()
            await b.aclose()

    run(main())


HOLDER = """
import asyncio, sys
from onceq._ledger.file_guard import FileGuard
from onceq._ledger.pg.guard import PgGuard
from pathlib import Path
kind, where = sys.argv[1], sys.argv[2]
async def main():
    g = PgGuard(where, "f") if kind == "postgresql" else FileGuard(Path(where), "f")
    await g.claim("m1")
    print("held", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


@pytest.mark.parametrize("kind", ["file", "postgresql"])
def test_kill_9_of_a_holder_frees_its_lease_within_a_second(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    where = str(tmp_path / "l-inflight") if kind == "file" else request.getfixturevalue("pg_url")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, kind, where], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"

        async def main() -> float:
            g = PgGuard(where, "f") if kind == "postgresql" else FileGuard(Path(where), "f")
            waiting = asyncio.create_task(g.claim("m1"))
            await asyncio.sleep(0.5)
            assert not waiting.done(), "the holder's lease was not seen"
            os.kill(holder.pid, signal.SIGKILL)
            t0 = time.monotonic()
            await asyncio.wait_for(waiting, 5)
            took = time.monotonic() - t0
            await g.aclose()
            return took

        took = run(main())
    finally:
        holder.kill()
        holder.wait()
    print(f"\n{kind}: claimed {took:.2f}s after the holder's kill -9")
    assert took < 1.0  # type: ignore[operator]


def test_claims_of_one_tick_go_out_in_one_query(pg_url: str) -> None:
    async def main() -> None:
        g = PgGuard(pg_url, "f")
        await asyncio.gather(*(g.claim(f"m{i}") for i in range(300)))
        assert g.batches == 1
        # Held by this session: another sees all of them taken.
        with psycopg.connect(pg_url, autocommit=True) as other:
            taken = other.execute(
                "SELECT count(*) FROM unnest(%s::text[]) k"
                " WHERE NOT pg_try_advisory_lock(hashtextextended('f/' || k, 0))",
                ([f"m{i}" for i in range(300)],),
            ).fetchone()
            assert taken == (300,)
        for i in range(300):
            await g.release(f"m{i}")
        await asyncio.sleep(0.2)  # the releases go out with the next batch
        await g.claim("x")  # which this is: it carries the 300 unlocks
        with psycopg.connect(pg_url, autocommit=True) as other:
            # This database's locks: tests running beside this one hold their own.
            n = other.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database ="
                " (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchone()
            assert n == (1,)  # only x
        await g.aclose()

    run(main())


def _terminate_guards(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = 'onceq-guard' AND datname = current_database()"
        ).fetchone()
        return int(row[0]) if row else 0


def test_a_lost_guard_connection_lets_claims_through_and_comes_back(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        g, other = PgGuard(pg_url, "f"), PgGuard(pg_url, "f")
        await g.claim("m1")
        await other.claim("m2")  # other's session, not terminated below: a fresh one later
        await asyncio.to_thread(_terminate_guards, pg_url)
        # The lost session took m1's lock with it; claims do not wait for a reconnect.
        t0 = time.monotonic()
        await asyncio.wait_for(g.claim("m3"), 2)
        assert time.monotonic() - t0 < 1.0
        assert g.unguarded == 1
        await g.release("m1")  # of the lost session: nothing to give back, no error
        # It reconnects by itself: locks work again (a held id waits).
        await asyncio.sleep(0.3)
        await g.claim("m4")
        other2 = PgGuard(pg_url, "f")
        waiting = asyncio.create_task(other2.claim("m4"))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await g.release("m4")
        await asyncio.wait_for(waiting, 2)
        for x in (g, other, other2):
            await x.aclose()

    with caplog.at_level(logging.WARNING, logger="onceq.pg.guard"):
        run(main())
    lines = [r.getMessage() for r in caplog.records]
    assert sum("connection lost" in m for m in lines) == 1, lines
    assert sum("reconnected after" in m for m in lines) == 1, lines


def test_a_secret_in_the_url_is_not_in_the_guards_warnings(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = pg_url.replace("postgres@", "postgres:s3cret-pw@")  # trust auth: any password

    async def main() -> None:
        g = PgGuard(url, "f")
        await g.claim("a")
        await asyncio.to_thread(_terminate_guards, pg_url)
        await g.claim("b")
        await g.claim("c")
        await g.aclose()

    with caplog.at_level(logging.WARNING, logger="onceq.pg.guard"):
        run(main())
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "connection lost" in text and "s3cret-pw" not in text and "***" in text


def test_two_file_guards_of_one_process_wait_for_each_other(tmp_path: Path) -> None:
    async def main() -> None:
        lock = tmp_path / "l-inflight"
        await _held_until_released(FileGuard(lock, "f"), FileGuard(lock, "f"))

    run(main())


PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, int(sys.argv[2]), os.SEEK_SET)
    print("free")
except OSError:
    print("held")
"""


def _seen_from_outside(path: Path, msg_id: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(path), str(lock_offset("f", msg_id))],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def test_closing_one_file_guard_keeps_the_others_locks(tmp_path: Path) -> None:
    """POSIX locks die with ANY close of the file in the process: the guards share one
    descriptor, so a flow that ends does not free another flow's leases."""
    lock = tmp_path / "l-inflight"

    async def main() -> None:
        a, b = FileGuard(lock, "f"), FileGuard(lock, "f")
        await a.claim("m1")
        await b.claim("m2")
        assert _seen_from_outside(lock, "m1") == "held"
        await b.aclose()
        assert _seen_from_outside(lock, "m1") == "held"
        assert _seen_from_outside(lock, "m2") == "free"
        await a.release("m1")
        assert _seen_from_outside(lock, "m1") == "free"
        await a.aclose()
        await a.aclose()  # twice is harmless

    run(main())
    assert lock.stat().st_size == 0  # locks beyond the end: the file stays empty


def test_guard_for_fits_the_ledger(tmp_path: Path, pg_url: str) -> None:
    with open_ledger(tmp_path / "l.db", "amqp") as sqlite_ledger:
        g = guard_for(sqlite_ledger)
        assert isinstance(g, FileGuard) and g.path == tmp_path / "l.db-inflight"
        run(g.aclose())
    with open_ledger(pg_url, "amqp", flow="inv") as pg_ledger:
        g = guard_for(pg_ledger)
        assert isinstance(g, PgGuard) and g.flow == "inv"
        run(g.aclose())


def test_file_guard_cost_per_message(tmp_path: Path) -> None:
    """The measured reason SQLite has a guard at all: claim + release costs a few µs."""

    async def main() -> float:
        g = FileGuard(tmp_path / "l-inflight", "f")
        ids = [f"m{i}" for i in range(5000)]
        t0 = time.perf_counter()
        for m in ids:
            await g.claim(m)
            await g.release(m)
        took = (time.perf_counter() - t0) / len(ids)
        await g.aclose()
        return took

    per = run(main())
    print(f"\nFileGuard claim+release: {per * 1e6:.1f} µs per message")  # type: ignore[operator]
    assert per < 100e-6  # type: ignore[operator]


def test_a_server_out_of_lock_space_lets_claims_through_and_keeps_the_leases(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """'out of shared memory' (53200) is not a lost connection: the session and the
    leases it holds are kept, the batch goes unguarded, one WARNING says what to raise."""
    import onceq._ledger.pg.guard as pg_guard

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION full_lock_table(ids text, flow text) RETURNS SETOF text"
            " LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'out of shared memory'"
            " USING ERRCODE = '53200'; END $$"
        )
    real_sql = pg_guard.CLAIM_SQL

    async def main() -> None:
        g = PgGuard(pg_url, "f")
        await g.claim("m1")  # a real lease
        monkeypatch.setattr(pg_guard, "CLAIM_SQL", "SELECT * FROM full_lock_table(%s, %s)")
        await asyncio.wait_for(g.claim("m2"), 2)
        await asyncio.wait_for(g.claim("m3"), 2)
        assert g.unguarded == 2
        monkeypatch.setattr(pg_guard, "CLAIM_SQL", real_sql)
        other = PgGuard(pg_url, "f")
        waiting = asyncio.create_task(other.claim("m1"))  # m1's lease survived
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await g.release("m1")
        await asyncio.wait_for(waiting, 2)
        await g.aclose()
        await other.aclose()

    with caplog.at_level(logging.WARNING, logger="onceq.pg.guard"):
        run(main())
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "out of lock space" in lines[0], lines
    assert "max_locks_per_transaction" in lines[0]


def test_a_nul_in_a_msg_id_fails_no_batch(make_guard: Make) -> None:
    """PostgreSQL text cannot hold NUL: sent as it is, such an id (from a library
    user's own decoder) would fail the whole tick's batch. It is a key like any other:
    held while claimed, waited for by a twin, and the other claims of its tick go on."""

    async def main() -> None:
        a, b = make_guard(), make_guard()
        await asyncio.gather(a.claim("bad\x00id"), a.claim("good"))
        twin = asyncio.create_task(b.claim("bad\x00id"))
        await asyncio.sleep(0.3)
        assert not twin.done(), "a twin of a NUL id got its lease while it was held"
        await a.release("bad\x00id")
        await asyncio.wait_for(twin, 2)
        await b.release("bad\x00id")
        await a.release("good")
        await a.aclose()
        await b.aclose()

    run(main())
