"""The heartbeat: a consumer's state row in the ledger, on both kinds of ledger.

What must hold: a row at start, a row within a second of a watched change (the
breaker), at once on poke(), a final "stopped" row on aclose; a failed write never
raises into the loop and is logged once; a ledger that does not exist is never
created; beside a writer committing back to back, neither side meets "database is
locked". And the schema: a current ledger without the table gets it on open, a
0.1.0 ledger still migrates.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from onceq._ledger.db import connect
from onceq._ledger.pg.schema import VERSION as PG_VERSION
from onceq._ledger.schema import VERSION
from onceq._ledger.target import is_pg_url, open_ledger
from onceq._ops.heartbeat import Heartbeat
from support import open_db


def rows(target: str) -> list[dict[str, Any]]:
    sql = "SELECT flow, consumer, host, pid, started_at, updated_at, every_s, state FROM {t}"
    if is_pg_url(target):
        with psycopg.connect(target, autocommit=True) as conn:
            got = conn.execute(sql.format(t="onceq.consumers")).fetchall()
    else:
        with open_db(target) as conn:
            got = conn.execute(sql.format(t="consumers")).fetchall()
    keys = ("flow", "consumer", "host", "pid", "started_at", "updated_at", "every_s", "state")
    out = [dict(zip(keys, r, strict=True)) for r in got]
    for r in out:
        r["state"] = json.loads(r["state"])
    return out


async def until(pred: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met"
        await asyncio.sleep(0.02)


def test_a_consumer_publishes_its_state_and_its_final_row(ledger_target: str) -> None:
    open_ledger(ledger_target, flow="inv").close()  # the consumer made the ledger
    state = {"breaker": "closed", "in_flight": 0, "connected": True, "stopping": False}

    async def main() -> None:
        hb = Heartbeat(ledger_target, "inv", lambda: dict(state), every=30)
        await hb.start()
        await until(lambda: hb.writes == 1)
        [row] = rows(ledger_target)
        assert row["flow"] == "inv" and row["consumer"] == hb.consumer
        assert row["consumer"].split(":")[1] == str(row["pid"])
        assert row["state"] == {**state, "status": "running"}
        assert row["every_s"] == 30
        # A watched field changes: published within the 1 s check, not after `every`.
        state["breaker"] = "open"
        await until(lambda: rows(ledger_target)[0]["state"]["breaker"] == "open", 3)
        # A field that is not watched waits for the beat, or a poke.
        state["in_flight"] = 4
        await asyncio.sleep(1.5)
        assert rows(ledger_target)[0]["state"]["in_flight"] == 0
        hb.poke()
        await until(lambda: rows(ledger_target)[0]["state"]["in_flight"] == 4, 3)
        state["stopping"] = True
        await hb.aclose()
        [row] = rows(ledger_target)
        assert row["state"]["status"] == "stopped" and row["state"]["stopping"] is True
        assert row["updated_at"] > row["started_at"]

    asyncio.run(main())


def test_the_beat_repeats_every_period(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    connect(db).close()

    async def main() -> list[str]:
        hb = Heartbeat(db, "inv", lambda: {"breaker": None}, every=0.2)
        await hb.start()
        await until(lambda: hb.writes >= 4, 5)
        seen = [rows(str(db))[0]["updated_at"]]
        await asyncio.sleep(0.5)
        seen.append(rows(str(db))[0]["updated_at"])
        await hb.aclose()
        return seen

    first, later = asyncio.run(main())
    assert later > first


def test_a_ledger_that_cannot_be_written_is_logged_once_and_never_created(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "missing.db"
    broken: list[int] = []

    def state() -> dict[str, Any]:
        broken.append(1)
        raise RuntimeError("a bug in the state callable")

    async def main() -> None:
        hb = Heartbeat(db, "inv", state, every=0.05)
        await hb.start()
        await until(lambda: hb.failures >= 5, 5)
        await hb.aclose()  # no raise, even though every write failed

    with caplog.at_level(logging.WARNING, logger="onceq.heartbeat"):
        asyncio.run(main())
    assert not db.exists()
    warned = [r for r in caplog.records if "cannot publish" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    assert broken  # the callable's failure did not stop the beat either


def test_state_callable_failure_is_published_as_an_error(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    connect(db).close()

    async def main() -> None:
        hb = Heartbeat(db, "inv", lambda: 1 / 0, every=10)  # type: ignore[arg-type,return-value]
        await hb.start()
        await until(lambda: hb.writes >= 1)
        await hb.aclose()

    asyncio.run(main())
    state = rows(str(db))[0]["state"]
    assert state["status"] == "stopped" and "ZeroDivisionError" in state["error"]


def test_old_rows_of_the_flow_are_pruned_at_start(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    connect(db).close()
    with open_db(db) as conn:
        for cid, at, status in (
            ("h:1:1", "2020-01-01T00:00:00+00:00", "running"),  # killed long ago
            ("h:2:1", "2020-01-01T00:00:00+00:00", "stopped"),
            ("h:3:1", "2999-01-01T00:00:00+00:00", "stopped"),  # recent: kept
        ):
            conn.execute(
                "INSERT INTO consumers VALUES ('inv', ?, 'h', 1, ?, ?, 5, ?)",
                (cid, at, at, json.dumps({"status": status})),
            )
        conn.execute(
            "INSERT INTO consumers VALUES ('other', 'h:4:1', 'h', 1, ?, ?, 5, '{}')",
            ("2020-01-01T00:00:00+00:00",) * 2,
        )

    async def main() -> str:
        hb = Heartbeat(db, "inv", dict, every=10)
        await hb.start()
        await until(lambda: hb.writes >= 1)
        await hb.aclose()
        return hb.consumer

    me = asyncio.run(main())
    assert {(r["flow"], r["consumer"]) for r in rows(str(db))} == {
        ("inv", "h:3:1"),
        ("inv", me),
        ("other", "h:4:1"),  # another flow's rows are its own heartbeat's to prune
    }


def test_beside_a_busy_writer_nobody_meets_database_is_locked(tmp_path: Path) -> None:
    """A consumer's group commits (BEGIN IMMEDIATE, 120 s busy timeout, a group of 50
    every 2 ms: far busier than a consumer that waits for deliveries) and a heartbeat
    beating every 10 ms for 3 s: every commit succeeds, and the beats get through.
    (A writer that never lets go of the lock at all starves the heartbeat, whose
    beats are then skipped: the consumer still never fails.)"""
    db = tmp_path / "ledger.db"
    connect(db).close()
    stop = threading.Event()
    errors: list[BaseException] = []
    commits = 0

    def writer() -> None:
        nonlocal commits
        conn = connect(db)
        try:
            n = 0
            while not stop.is_set():
                conn.execute("BEGIN IMMEDIATE")
                for _ in range(50):
                    n += 1
                    conn.execute(
                        "INSERT INTO messages (flow, msg_id, processed_at, source)"
                        " VALUES ('inv', ?, 'now', 'dirq')",
                        (f"m{n}",),
                    )
                conn.execute("COMMIT")
                commits += 1
                time.sleep(0.002)
        except BaseException as exc:
            errors.append(exc)
        finally:
            conn.close()

    async def main() -> Heartbeat:
        hb = Heartbeat(db, "inv", lambda: {"n": commits}, every=0.01)
        await hb.start()
        await asyncio.sleep(3)
        await hb.aclose()
        return hb

    t = threading.Thread(target=writer)
    t.start()
    try:
        hb = asyncio.run(main())
    finally:
        stop.set()
        t.join()
    assert not errors, errors
    assert commits > 10
    assert hb.writes > 20


def test_a_schema_3_ledger_without_the_table_gets_it_on_open(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    connect(db).close()
    with open_db(db) as conn:
        conn.execute("DROP TABLE consumers")  # a ledger written before issue 10
    conn = connect(db, create=False)
    try:
        have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert "consumers" in have
        assert conn.execute("PRAGMA user_version").fetchone()[0] == VERSION  # no bump
    finally:
        conn.close()


def test_a_pg_ledger_without_the_table_gets_it_on_open(pg_url: str) -> None:
    open_ledger(pg_url, flow="inv").close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP TABLE onceq.consumers")
    open_ledger(pg_url, flow="inv").close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        got = conn.execute("SELECT to_regclass('onceq.consumers') IS NOT NULL").fetchone()
        version = conn.execute("SELECT value FROM onceq.meta").fetchone()
    assert got == (True,) and version == (str(PG_VERSION),)  # no version bump


def test_a_0_1_0_ledger_migrates_with_the_consumers_table(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    with open_db(db) as conn:
        conn.executescript(
            "CREATE TABLE processed (msg_id TEXT PRIMARY KEY, order_no TEXT, seq INTEGER,"
            " amount REAL, processed_at TEXT, source TEXT, ref TEXT);"
            "CREATE TABLE duplicates (msg_id TEXT, ref TEXT, seen_at TEXT);"
            "CREATE TABLE failures (id INTEGER PRIMARY KEY, msg_id TEXT, ref TEXT, source TEXT,"
            " reason TEXT, detail TEXT, attempt INTEGER, action TEXT, at TEXT);"
            "CREATE TABLE replays (id INTEGER PRIMARY KEY, ref TEXT, at TEXT);"
            "INSERT INTO processed VALUES ('a', 'o1', 1, 2.5, 'then', 'dirq', 'a.json');"
        )
    conn = connect(db)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"messages", "consumers"} <= tables
        assert conn.execute("SELECT msg_id FROM messages").fetchall() == [("a",)]
    finally:
        conn.close()


def test_the_writer_thread_never_runs_on_the_loop(tmp_path: Path) -> None:
    """The write happens in the heartbeat's own thread: a slow ledger cannot stall the loop."""
    db = tmp_path / "ledger.db"
    connect(db).close()
    threads: list[str] = []

    async def main() -> None:
        hb = Heartbeat(db, "inv", dict, every=10)
        original = hb._write

        def spy(state: dict[str, Any]) -> None:
            threads.append(threading.current_thread().name)
            original(state)

        hb._write = spy  # type: ignore[method-assign]
        await hb.start()
        await until(lambda: hb.writes >= 1)
        await hb.aclose()

    asyncio.run(main())
    assert threads and all(n.startswith("onceq-heartbeat") for n in threads), threads


def test_a_role_that_may_not_create_the_table_still_opens_the_ledger(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A ledger made by its owner, used by a consumer role without CREATE on schema
    onceq: the missing consumers table is a warning, never a ledger that will not open."""
    import uuid

    from psycopg.conninfo import conninfo_to_dict

    open_ledger(pg_url, flow="inv").close()
    role = f"onceq_ro_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP TABLE onceq.consumers")
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT USAGE ON SCHEMA onceq TO {role}")
        conn.execute(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA onceq TO {role}"
        )
        conn.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA onceq TO {role}")
    try:
        params = conninfo_to_dict(pg_url)
        params["user"] = role
        as_role = "postgresql://{user}@{host}:{port}/{dbname}".format(**params)
        with caplog.at_level(logging.WARNING, logger="onceq.ledger"):
            open_ledger(as_role, flow="inv").close()
        assert any(getattr(r, "event", None) == "ledger-table-missing" for r in caplog.records), (
            caplog.text
        )
        with psycopg.connect(pg_url, autocommit=True) as conn:
            got = conn.execute("SELECT to_regclass('onceq.consumers')").fetchone()
        assert got == (None,)  # not made, and nothing else refused
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")
