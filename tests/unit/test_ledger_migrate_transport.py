"""Schema 4 (issue 21): dead_ops.transport checks a source tag's shape, not a list.

A schema-3 SQLite ledger and a version-1 PostgreSQL ledger (their DDL verbatim, rows
in dead_ops, an operator's index) are migrated in place: every row kept, the new
source 'nats' accepted afterwards, a malformed tag still refused by the database
itself, not only by `start_op`'s check.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from onceq._ledger.pg.schema import DDL as PG_DDL
from onceq._ledger.pg.schema import TRANSPORT_CHECK as PG_TRANSPORT_CHECK
from onceq._ledger.pg.schema import VERSION as PG_VERSION
from onceq._ledger.schema import VERSION
from onceq._ledger.sqlite import Ledger
from onceq._ledger.target import open_ledger
from onceq.errors import LedgerError
from support import open_db

# Schema 3's DDL, verbatim from `git show 33a8472:src/onceq/_ledger/schema.py`.
V3_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    flow              TEXT NOT NULL,             -- the flow's name: dedup is per flow
    msg_id            TEXT NOT NULL,
    grp               TEXT,                      -- the flow's group field (order_no, claimId)
    seq               INTEGER,                   -- the flow's sequence field
    kept              TEXT NOT NULL DEFAULT '{}',-- the flow's keep paths, a JSON object
    partner_duplicate INTEGER NOT NULL DEFAULT 0,-- the partner said it already had it
    processed_at      TEXT NOT NULL,             -- UTC, ISO 8601
    source            TEXT NOT NULL,             -- dirq | amqp
    ref               TEXT,                      -- the file name / delivery that took effect
    PRIMARY KEY (flow, msg_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS duplicates (
    flow    TEXT NOT NULL,
    msg_id  TEXT NOT NULL,
    ref     TEXT NOT NULL,
    seen_at TEXT NOT NULL,
    PRIMARY KEY (flow, msg_id, ref) -- a recovered copy is not counted twice
);
CREATE TABLE IF NOT EXISTS failures (
    id      INTEGER PRIMARY KEY,
    flow    TEXT NOT NULL,
    msg_id  TEXT,                   -- NULL when the message never parsed
    ref     TEXT NOT NULL,
    source  TEXT NOT NULL,
    reason  TEXT NOT NULL,          -- parse, missing-field, http-422, sql-rejected …
    detail  TEXT NOT NULL DEFAULT '',
    attempt INTEGER NOT NULL,
    action  TEXT NOT NULL,          -- requeue | delay | dead
    at      TEXT NOT NULL,
    delay_s REAL                    -- the retry tier's delay (NULL unless action = delay)
);
CREATE INDEX IF NOT EXISTS failures_msg ON failures(flow, msg_id);
CREATE INDEX IF NOT EXISTS failures_ref ON failures(ref);
-- A replay gives a dead message its retries again: the failures of its msg_id with
-- id <= reset_after no longer count as attempts (reset_after = max(failures.id) of
-- the msg_id when it was replayed, 0 when the msg_id is not known).
CREATE TABLE IF NOT EXISTS replays (
    id          INTEGER PRIMARY KEY,
    flow        TEXT NOT NULL,
    ref         TEXT NOT NULL,
    at          TEXT NOT NULL,
    msg_id      TEXT,
    op          INTEGER,                    -- dead_ops.id, NULL for a single-file replay
    reset_after INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS replays_msg ON replays(flow, msg_id);
-- The audit of every dead-letter operation: when, what, which filter, how many.
-- finished_at stays NULL while it runs, and for good when it was killed.
CREATE TABLE IF NOT EXISTS dead_ops (
    id          INTEGER PRIMARY KEY,
    flow        TEXT NOT NULL,
    transport   TEXT NOT NULL CHECK (transport IN ('amqp', 'dirq')),
    op          TEXT NOT NULL CHECK (op IN ('replay', 'purge')),
    filter      TEXT NOT NULL DEFAULT '{}', -- the filter as given, a JSON object
    queue       TEXT NOT NULL DEFAULT '',
    started_at  TEXT NOT NULL,
    finished_at TEXT,
    count       INTEGER NOT NULL DEFAULT 0, -- messages replayed / purged so far
    ids         TEXT NOT NULL DEFAULT '[]'  -- purge: the msg_ids / refs it removed
);
CREATE TABLE IF NOT EXISTS consumers (
    flow       TEXT NOT NULL,
    consumer   TEXT NOT NULL,             -- host:pid:n (onceq._ops.heartbeat)
    host       TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    started_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,             -- older than 3 x every_s: the consumer died
    every_s    REAL NOT NULL,             -- how often it publishes
    state      TEXT NOT NULL DEFAULT '{}',-- JSON: status, breaker, in_flight, connected …
    PRIMARY KEY (flow, consumer)
);
"""

T = "2026-11-01T00:00:0{}.000000+00:00"
# (id, flow, transport, op, filter, queue, started_at, finished_at, count, ids)
V3_DEAD_OPS = [
    (
        3,
        "default",
        "amqp",
        "replay",
        '{"reason": "http-503"}',
        "claim.dead",
        T.format(1),
        None,
        2,
        "[]",
    ),
    (
        7,
        "other",
        "dirq",
        "purge",
        '{"all": true}',
        "/q/error",
        T.format(2),
        T.format(3),
        1,
        '["m-9"]',
    ),
]
# A replay of operation 3: its op must still name the same row after the rebuild.
V3_REPLAYS = [(1, "default", "a.json", T.format(1), "m-1", 3, 0)]
MALFORMED = ["Nats", "", "dead-letter", "a" * 33, "q.dead", "1amqp", "nats ", "naïve"]


def make_v3_ledger(path: Path, *, extra: str = "") -> Path:
    with open_db(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(V3_SCHEMA)
        conn.execute("DROP TABLE consumers")  # additive: a schema-3 ledger may lack it
        conn.executemany("INSERT INTO dead_ops VALUES (?,?,?,?,?,?,?,?,?,?)", V3_DEAD_OPS)
        conn.executemany("INSERT INTO replays VALUES (?,?,?,?,?,?,?)", V3_REPLAYS)
        # An operator's index and trigger on dead_ops: the rebuild must keep them.
        conn.execute("CREATE INDEX dead_ops_started ON dead_ops(flow, started_at)")
        conn.execute("CREATE TABLE op_log (op_id INTEGER)")
        conn.execute(
            "CREATE TRIGGER dead_ops_log AFTER INSERT ON dead_ops"
            " BEGIN INSERT INTO op_log VALUES (new.id); END"
        )
        if extra:
            conn.executescript(extra)
        conn.execute("PRAGMA user_version = 3")
    return path


def q(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with open_db(path) as conn:
        return conn.execute(sql).fetchall()


def dump(path: Path) -> tuple[int, list[str]]:
    with open_db(path) as conn:
        return conn.execute("PRAGMA user_version").fetchone()[0], list(conn.iterdump())


def test_the_v3_schema_above_is_the_current_one_but_for_the_transport_check() -> None:
    """The verbatim copy is schema 3: the migration's only change is that CHECK."""
    from onceq._ledger.schema import SCHEMA, TRANSPORT_CHECK

    old = "CHECK (transport IN ('amqp', 'dirq'))"
    assert V3_SCHEMA.count(old) == 1
    new = V3_SCHEMA.replace(old, f"CHECK ({TRANSPORT_CHECK})")
    strip = lambda s: [ln.split("--")[0].rstrip() for ln in s.splitlines()]  # noqa: E731
    assert strip(new) == strip(SCHEMA)


def test_a_schema_3_ledger_is_migrated_with_its_dead_ops_and_accepts_nats(tmp_path: Path) -> None:
    path = make_v3_ledger(tmp_path / "ledger.db")
    with Ledger(path) as ledger:
        assert not ledger.created
        assert [o["id"] for o in ledger.dead_ops()] == [3]  # flow 'default' only
        op = ledger.start_op("nats", "replay", {"reason": "http-503"}, "ORDERS")
        assert op > 7  # after the kept ids: none reused
    assert q(path, "PRAGMA user_version") == [(VERSION,)]
    assert q(path, "SELECT * FROM dead_ops WHERE id <= 7 ORDER BY id") == V3_DEAD_OPS
    assert q(path, f"SELECT transport, queue FROM dead_ops WHERE id = {op}") == [("nats", "ORDERS")]
    assert q(path, "SELECT * FROM replays") == V3_REPLAYS
    names = {r[0] for r in q(path, "SELECT name FROM sqlite_master")}
    assert {"dead_ops_started", "dead_ops_log", "consumers"} <= names
    assert "onceq_v4_dead_ops" not in names
    assert q(path, "SELECT op_id FROM op_log") == [(op,)]  # the trigger still fires
    assert q(path, "PRAGMA integrity_check") == [("ok",)]
    before = dump(path)
    Ledger(path).close()
    assert dump(path) == before  # a second open changes nothing


@pytest.mark.parametrize("tag", MALFORMED)
def test_a_malformed_tag_is_refused_by_the_migrated_table(tmp_path: Path, tag: str) -> None:
    path = make_v3_ledger(tmp_path / "ledger.db")
    Ledger(path).close()
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"), open_db(path) as conn:
        conn.execute(
            "INSERT INTO dead_ops (flow, transport, op, started_at) VALUES (?,?,?,?)",
            ("default", tag, "purge", T.format(4)),
        )
    with Ledger(path) as ledger, pytest.raises(ValueError, match="transport"):
        ledger.start_op(tag, "purge", {}, "q")
    assert q(path, "SELECT count(*) FROM dead_ops") == [(2,)]


def test_a_dead_ops_with_unknown_columns_is_refused_unchanged(tmp_path: Path) -> None:
    path = make_v3_ledger(tmp_path / "ledger.db", extra="ALTER TABLE dead_ops ADD ticket TEXT;")
    before = dump(path)
    with pytest.raises(LedgerError, match=r"never wrote in dead_ops \(ticket\).*left as it was"):
        Ledger(path)
    assert dump(path) == before


def test_a_migration_that_fails_midway_leaves_the_ledger_as_it_was(tmp_path: Path) -> None:
    # A table already named as the rebuild's new one: its CREATE fails after nothing,
    # and a row that breaks the copy fails it after the CREATE; both roll back whole.
    for extra in (
        "CREATE TABLE onceq_v4_dead_ops (x INTEGER);",
        "PRAGMA ignore_check_constraints = 1; INSERT INTO dead_ops"
        " (flow, transport, op, started_at) VALUES ('f', 'Bad!', 'purge', 't');",
    ):
        path = make_v3_ledger(tmp_path / f"ledger{len(extra)}.db", extra=extra)
        before = dump(path)
        with pytest.raises(
            LedgerError, match=r"cannot migrate a schema-3 ledger .* left as it was"
        ):
            Ledger(path)
        assert dump(path) == before


def test_a_new_ledger_of_either_kind_accepts_any_well_formed_tag(ledger_target: str) -> None:
    tags = {"nats", "kafka_2", "z" * 32}
    with open_ledger(ledger_target) as ledger:
        for tag in tags:
            ledger.start_op(tag, "replay", {}, "q")
        assert {o["transport"] for o in ledger.dead_ops()} == tags


# --- PostgreSQL ------------------------------------------------------------------------

# Version 1's DDL: today's but for the transport CHECK, as version 1 wrote it (unnamed:
# PostgreSQL named it dead_ops_transport_check).
V1_CHECK = "CHECK (transport IN ('amqp', 'dirq'))"


def pg(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def make_v1_pg_ledger(url: str, *, rename: str = "") -> None:
    assert PG_DDL.count(PG_TRANSPORT_CHECK) == 1
    pg(url, PG_DDL.replace(PG_TRANSPORT_CHECK, V1_CHECK))
    pg(url, "INSERT INTO onceq.meta VALUES ('schema_version', '1')")
    for row in V3_DEAD_OPS:
        pg(url, "INSERT INTO onceq.dead_ops VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)", row)
    # The identity past the ids given, as a ledger that issued them itself has it.
    pg(url, "SELECT setval(pg_get_serial_sequence('onceq.dead_ops', 'id'), 7)")
    pg(url, "CREATE INDEX dead_ops_started ON onceq.dead_ops(flow, started_at)")
    if rename:
        pg(
            url,
            f"ALTER TABLE onceq.dead_ops RENAME CONSTRAINT dead_ops_transport_check TO {rename}",
        )


def transport_checks(url: str) -> list[str]:
    return [
        r[0]
        for r in pg(
            url,
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid ="
            " 'onceq.dead_ops'::regclass AND contype = 'c' AND pg_get_constraintdef(oid)"
            " LIKE '%%transport%%'",
        )
    ]


@pytest.mark.pg
@pytest.mark.parametrize("rename", ["", "an_operator_named_it"])
def test_a_version_1_pg_ledger_is_migrated_with_its_dead_ops_and_accepts_nats(
    pg_url: str, rename: str
) -> None:
    make_v1_pg_ledger(pg_url, rename=rename)
    assert transport_checks(pg_url) == [
        "CHECK ((transport = ANY (ARRAY['amqp'::text, 'dirq'::text])))"
    ]
    with open_ledger(pg_url, create=False) as ledger:
        assert not ledger.created
        op = ledger.start_op("nats", "replay", {}, "ORDERS")
        assert op > 7
    assert pg(pg_url, "SELECT value FROM onceq.meta WHERE key = 'schema_version'") == [
        (str(PG_VERSION),)
    ]
    assert pg(pg_url, "SELECT * FROM onceq.dead_ops WHERE id <= 7 ORDER BY id") == V3_DEAD_OPS
    assert pg(pg_url, "SELECT transport FROM onceq.dead_ops WHERE id = %s", (op,)) == [("nats",)]
    assert pg(pg_url, "SELECT indexname FROM pg_indexes WHERE indexname = 'dead_ops_started'")
    assert len(transport_checks(pg_url)) == 1  # the old list is gone, whatever its name
    for tag in MALFORMED:
        with pytest.raises(psycopg.errors.CheckViolation):
            pg(
                pg_url,
                "INSERT INTO onceq.dead_ops (flow, transport, op, started_at) VALUES (%s,%s,%s,%s)",
                ("default", tag, "purge", T.format(4)),
            )
    open_ledger(pg_url, create=False).close()  # a second open: nothing left to do
    assert len(transport_checks(pg_url)) == 1
