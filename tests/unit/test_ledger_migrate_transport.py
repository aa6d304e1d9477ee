"""Schema 4 (issue 21): dead_ops.transport checks a source tag's shape, not a list.

A schema-3 SQLite ledger and a version-1 PostgreSQL ledger (today's DDL but for that
check, as tests/ledger_support.py and make_v1_pg_ledger build them; rows in dead_ops,
an operator's index) are migrated in place: every row kept, the new
source 'nats' accepted afterwards, a malformed tag still refused by the database
itself, not only by `start_op`'s check.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ledger_support import V3_TRANSPORT_CHECK, dump, old_ledger, q
from onceq._ledger.pg.schema import DDL as PG_DDL
from onceq._ledger.pg.schema import TRANSPORT_CHECK as PG_TRANSPORT_CHECK
from onceq._ledger.pg.schema import VERSION as PG_VERSION
from onceq._ledger.schema import VERSION
from onceq._ledger.sqlite import Ledger
from onceq._ledger.target import open_ledger
from onceq.errors import LedgerError
from support import open_db

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
    # An operator's index and trigger on dead_ops: the rebuild must keep them. No
    # consumers table: it came additively, so a schema-3 ledger may lack it.
    own = (
        "CREATE INDEX dead_ops_started ON dead_ops(flow, started_at);"
        " CREATE TABLE op_log (op_id INTEGER);"
        " CREATE TRIGGER dead_ops_log AFTER INSERT ON dead_ops"
        " BEGIN INSERT INTO op_log VALUES (new.id); END;"
    )
    rows = {"dead_ops": V3_DEAD_OPS, "replays": V3_REPLAYS}
    return old_ledger(path, 3, rows, drop=("consumers",), extra=own + extra)


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
# PostgreSQL named it dead_ops_transport_check): SQLite's schema 3's list.
V1_CHECK = V3_TRANSPORT_CHECK


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
