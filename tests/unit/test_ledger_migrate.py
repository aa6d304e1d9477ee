"""A ledger written by onceq 0.1.0 is migrated to the current schema in place, in one transaction.

`make_v010_ledger` builds a real 0.1.0 ledger: 0.1.0's DDL (verbatim from
`git show 036b324:src/onceq/ledger_db.py`), WAL as 0.1.0 set it, and rows in every
table, as a run of 0.1.0 left them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cli_support import invoke
from onceq._core.transport import Delivery, Kind, Settle
from onceq._exercise.processed_table import PROCESSED_TABLE
from onceq._ledger.schema import VERSION
from onceq._ledger.sqlite import Entry, Ledger
from onceq.errors import LedgerError
from support import open_db

V010_SCHEMA = """
CREATE TABLE IF NOT EXISTS processed (
    msg_id       TEXT PRIMARY KEY,
    order_no     TEXT,              -- the business key: an order number, a claimId
    seq          INTEGER,           -- the sender's sequence number within order_no
    amount       REAL,
    processed_at TEXT NOT NULL,     -- UTC, ISO 8601
    source       TEXT NOT NULL DEFAULT 'dirq',
    ref          TEXT               -- the file name / delivery that took effect
);
CREATE TABLE IF NOT EXISTS duplicates (
    msg_id  TEXT NOT NULL,
    ref     TEXT NOT NULL,
    seen_at TEXT NOT NULL,
    PRIMARY KEY (msg_id, ref)       -- a recovered copy is not counted twice
);
CREATE TABLE IF NOT EXISTS failures (
    id      INTEGER PRIMARY KEY,
    msg_id  TEXT,                   -- NULL when the message never parsed
    ref     TEXT NOT NULL,
    source  TEXT NOT NULL,
    reason  TEXT NOT NULL,          -- parse, missing-field, http-422, http-503, timeout …
    detail  TEXT NOT NULL DEFAULT '',
    attempt INTEGER NOT NULL,
    action  TEXT NOT NULL,          -- requeue | dead
    at      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS failures_msg ON failures(msg_id);
CREATE INDEX IF NOT EXISTS failures_ref ON failures(ref);
CREATE TABLE IF NOT EXISTS replays (
    id  INTEGER PRIMARY KEY,
    ref TEXT NOT NULL,
    at  TEXT NOT NULL
);
"""

PROCESSED = [
    ("m-1", "A", 1, 1200.0, "2026-01-01T00:00:01+00:00", "dirq", "msg-001.json"),
    ("m-2", "A", 2, 350.5, "2026-01-01T00:00:02+00:00", "dirq", "msg-002.json"),
    ("m-3", "B", 1, None, "2026-01-01T00:00:03+00:00", "dirq", "msg-003.json"),
    ("g-1", "C-1", None, 10.0, "2026-01-01T00:00:04+00:00", "amqp", "g-1-copy"),
]
DUPLICATES = [("m-1", "msg-011.json", "2026-01-01T00:00:05+00:00")]
FAILURES = [
    (1, None, "msg-009.json", "dirq", "parse", "line 1 column 2", 1, "dead", "2026-01-01T00:01"),
    (2, "m-7", "msg-010.json", "dirq", "missing-field", "amount", 1, "dead", "2026-01-01T00:02"),
    (5, "g-2", "tag-1", "amqp", "http-503", "", 1, "requeue", "2026-01-01T00:03"),
]
REPLAYS = [(3, "msg-009.json", "2026-01-01T00:04")]


def make_v010_ledger(path: Path) -> Path:
    """A ledger as onceq 0.1.0 left it: its schema, WAL, rows in every table."""
    with open_db(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(V010_SCHEMA)
        conn.executemany("INSERT INTO processed VALUES (?,?,?,?,?,?,?)", PROCESSED)
        conn.executemany("INSERT INTO duplicates VALUES (?,?,?)", DUPLICATES)
        conn.executemany("INSERT INTO failures VALUES (?,?,?,?,?,?,?,?,?)", FAILURES)
        conn.executemany("INSERT INTO replays VALUES (?,?,?)", REPLAYS)
    return path


def dump(path: Path) -> tuple[int, list[str]]:
    with open_db(path) as conn:
        return conn.execute("PRAGMA user_version").fetchone()[0], list(conn.iterdump())


def q(path: Path, sql: str) -> list[tuple[object, ...]]:
    with open_db(path) as conn:
        return conn.execute(sql).fetchall()


def test_a_010_ledger_is_migrated_with_its_rows(tmp_path: Path) -> None:
    path = make_v010_ledger(tmp_path / "ledger.db")
    with Ledger(path) as ledger:
        assert not ledger.created
        # the old rows keep deduplicating under the flow 'default'
        assert ledger.processed_ref("m-1") == "msg-001.json"
        assert ledger.duplicate_ids() == ["m-1"]
        assert ledger.failed_attempts("m-7") == 1
        assert ledger.last_failure("msg-010.json") == ("missing-field", "amount")
        assert ledger.counts() == {"processed": 4, "duplicates": 1, "failures": 3, "replays": 1}
    assert q(path, "PRAGMA user_version") == [(VERSION,)]
    assert q(
        path,
        "SELECT flow, msg_id, grp, seq, kept, partner_duplicate, processed_at, source, ref"
        " FROM messages ORDER BY processed_at",
    ) == [
        (
            "default",
            m,
            g,
            s,
            json.dumps({"amount": a}, separators=(",", ":")) if a is not None else "{}",
            0,
            at,
            src,
            r,
        )
        for m, g, s, a, at, src, r in PROCESSED
    ]
    assert q(path, "SELECT * FROM processed ORDER BY processed_at") == PROCESSED  # left as is
    assert q(path, "SELECT * FROM duplicates") == [("default", *r) for r in DUPLICATES]
    assert q(path, "SELECT * FROM failures ORDER BY id") == [
        (r[0], "default", *r[1:], None)
        for r in FAILURES  # delay_s: none was delayed
    ]
    # the replay's file failed before it unparsed (msg_id NULL): nothing to reset
    assert q(path, "SELECT * FROM replays") == [
        (3, "default", "msg-009.json", "2026-01-01T00:04", None, None, 0)
    ]
    assert q(path, "SELECT count(*) FROM dead_ops") == [(0,)]
    assert q(path, "SELECT json_extract(kept, '$.amount') FROM messages WHERE msg_id='m-2'") == [
        (350.5,)
    ]
    assert not [t for (t,) in q(path, "SELECT name FROM sqlite_master") if "v0" in t]
    # a second open changes nothing
    before = dump(path)
    Ledger(path, sql=PROCESSED_TABLE).close()
    assert dump(path) == before


def test_a_migrated_ledger_keeps_refusing_its_ids_and_keeps_writing_processed(
    tmp_path: Path,
) -> None:
    path = make_v010_ledger(tmp_path / "ledger.db")
    with Ledger(path, sql=PROCESSED_TABLE) as ledger:
        old = Entry(Delivery(b"", "again.json", "m-1", stable_ref=True), Kind.SUCCESS, Settle.ACK)
        new = Entry(
            Delivery(b"", "msg-020.json", "m-20", stable_ref=True),
            Kind.SUCCESS,
            Settle.ACK,
            fields={"group": "A", "seq": 3, "kept": {"amount": 5}},
        )
        ledger.commit([old, new])
        assert (old.kind, new.kind) == (Kind.DUPLICATE, Kind.SUCCESS)
    assert q(path, "SELECT msg_id, order_no, seq, amount FROM processed WHERE msg_id='m-20'") == [
        ("m-20", "A", 3, 5.0)
    ]


def test_two_processes_opening_one_010_ledger_migrate_it_once(tmp_path: Path) -> None:
    path = make_v010_ledger(tmp_path / "ledger.db")
    start = time.time() + 1.0
    script = textwrap.dedent(
        f"""
        import time, onceq._ledger.db as m  # the opener's name for the migration
        from onceq._ledger.sqlite import Ledger
        real = m.migrate
        def spy(conn, p):
            did = real(conn, p)
            print("migrated" if did else "found-migrated", flush=True)
            return did
        m.migrate = spy
        time.sleep(max(0.0, {start} - time.time()))
        Ledger({str(path)!r}).close()
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=60)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    flat = [w for o in outs for w in o]
    assert flat.count("migrated") == 1, outs  # the others found it done (or saw version 2)
    assert q(path, "SELECT count(*) FROM messages") == [(len(PROCESSED),)]
    assert q(path, "SELECT count(*) FROM failures") == [(len(FAILURES),)]


def test_a_migration_that_fails_midway_leaves_the_ledger_as_it_was(tmp_path: Path) -> None:
    path = make_v010_ledger(tmp_path / "ledger.db")
    # A broken rule (a trigger that writes to a table since dropped): the migration
    # copies processed into messages, then fails when it renames the next table.
    with open_db(path) as conn:
        conn.execute("CREATE TABLE audit (msg_id TEXT)")
        conn.execute(
            "CREATE TRIGGER audit_it AFTER INSERT ON duplicates"
            " BEGIN INSERT INTO audit VALUES (NEW.msg_id); END"
        )
        conn.execute("DROP TABLE audit")
    before = dump(path)
    with pytest.raises(LedgerError, match=r"cannot migrate .* left as it was"):
        Ledger(path)
    assert dump(path) == before
    # the CLI: one line, exit 8, nothing changed
    r = invoke("dirq", "order-check", "--db", str(path))
    assert r.returncode == 8, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onceq: ") and "ledger.db" in lines[0]
    assert dump(path) == before


def test_a_010_ledger_with_columns_it_never_had_is_refused(tmp_path: Path) -> None:
    path = make_v010_ledger(tmp_path / "ledger.db")
    with open_db(path) as conn:
        conn.execute("ALTER TABLE failures ADD COLUMN ticket TEXT")
    before = dump(path)
    with pytest.raises(LedgerError, match=r"never wrote \(failures.ticket\)"):
        Ledger(path)
    assert dump(path) == before


def test_a_newer_ledger_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    Ledger(path).close()
    with open_db(path) as conn:
        conn.execute(f"PRAGMA user_version = {VERSION + 1}")
    before = dump(path)
    r = invoke("dirq", "order-check", "--db", str(path))
    assert r.returncode == 8
    assert r.stderr.strip().count("\n") == 0 and "written by a newer onceq" in r.stderr
    assert dump(path) == before


def test_the_migration_holds_across_the_cli(tmp_path: Path) -> None:
    """A 0.1.0 queue folder: the next `dirq consume` migrates and refuses the old ids."""
    qdir = tmp_path / "q"
    assert invoke("dirq", "init", str(qdir)).returncode == 0
    make_v010_ledger(qdir / "ledger.db")
    for name, doc in {
        "old.json": {"msg_id": "m-1", "order_no": "A", "seq": 1, "amount": 1},
        "new.json": {"msg_id": "m-9", "order_no": "A", "seq": 3, "amount": 2},
    }.items():
        (qdir / "inbox" / name).write_text(json.dumps(doc))
    r = invoke("dirq", "consume", str(qdir), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["processed"], out["duplicates"]) == (1, 1)
    assert sorted(os.listdir(qdir / "done")) == ["new.json", "old.json"]
    assert q(qdir / "ledger.db", "SELECT count(*) FROM processed") == [(len(PROCESSED) + 1,)]
