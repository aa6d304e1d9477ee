"""Old SQLite ledgers, built as the onceq of their schema left them, for the migration
tests (tests/unit/test_ledger_schema3.py: 2 → now; test_ledger_migrate_transport.py:
3 → now): the DDL of each old schema held once, one builder, and the reads the tests
compare before and after.

    path = old_ledger(tmp_path / "l.db", 2, {"messages": [...], "replays": [...]})
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from onceq._ledger.schema import SCHEMA, TRANSPORT_CHECK, VERSION
from support import open_db

# Schema 2's DDL, verbatim from `git show 357c42a:src/onceq/ledger_db.py`.
V2_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    flow              TEXT NOT NULL,
    msg_id            TEXT NOT NULL,
    grp               TEXT,
    seq               INTEGER,
    kept              TEXT NOT NULL DEFAULT '{}',
    partner_duplicate INTEGER NOT NULL DEFAULT 0,
    processed_at      TEXT NOT NULL,
    source            TEXT NOT NULL,
    ref               TEXT,
    PRIMARY KEY (flow, msg_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS duplicates (
    flow    TEXT NOT NULL,
    msg_id  TEXT NOT NULL,
    ref     TEXT NOT NULL,
    seen_at TEXT NOT NULL,
    PRIMARY KEY (flow, msg_id, ref)
);
CREATE TABLE IF NOT EXISTS failures (
    id      INTEGER PRIMARY KEY,
    flow    TEXT NOT NULL,
    msg_id  TEXT,
    ref     TEXT NOT NULL,
    source  TEXT NOT NULL,
    reason  TEXT NOT NULL,
    detail  TEXT NOT NULL DEFAULT '',
    attempt INTEGER NOT NULL,
    action  TEXT NOT NULL,
    at      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS failures_msg ON failures(flow, msg_id);
CREATE INDEX IF NOT EXISTS failures_ref ON failures(ref);
CREATE TABLE IF NOT EXISTS replays (
    id   INTEGER PRIMARY KEY,
    flow TEXT NOT NULL,
    ref  TEXT NOT NULL,
    at   TEXT NOT NULL
);
"""

# Schema 3's transport check, a list (`git show 33a8472:src/onceq/_ledger/schema.py`).
V3_TRANSPORT_CHECK = "CHECK (transport IN ('amqp', 'dirq'))"


def v3_schema() -> str:
    """Schema 3's DDL: today's (schema 4) but for dead_ops' transport check, which the
    one migration between them changes. Derived, not copied, so a test cannot keep a
    stale copy; a schema 5 must freeze schema 4's DDL here first (the assert says so)."""
    assert VERSION == 4, "schema 5: copy schema 4's DDL here verbatim, derive 3 from it"
    new = f"CHECK ({TRANSPORT_CHECK})"
    assert SCHEMA.count(new) == 1
    return SCHEMA.replace(new, V3_TRANSPORT_CHECK)


def schema_of(version: int) -> str:
    return {2: V2_SCHEMA, 3: v3_schema()}[version]


def old_ledger(
    path: Path,
    version: int,
    rows: dict[str, list[tuple[Any, ...]]],
    *,
    drop: tuple[str, ...] = (),
    extra: str = "",
) -> Path:
    """A schema-`version` ledger at `path` (WAL, as every onceq set it) holding `rows`
    ({table: its rows, every column}); `drop`: tables an older ledger may lack;
    `extra`: an operator's own SQL (an index, a trigger) run before the version is set."""
    with open_db(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(schema_of(version))
        for table in drop:
            conn.execute(f"DROP TABLE {table}")
        for table, values in rows.items():
            if values:
                marks = ",".join("?" * len(values[0]))
                conn.executemany(f"INSERT INTO {table} VALUES ({marks})", values)
        if extra:
            conn.executescript(extra)
        conn.execute(f"PRAGMA user_version = {int(version)}")
    return path


def q(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with open_db(path) as conn:
        return conn.execute(sql).fetchall()


def dump(path: Path) -> tuple[int, list[str]]:
    """The version and every statement of the file: what a refused migration leaves as it was."""
    with open_db(path) as conn:
        return conn.execute("PRAGMA user_version").fetchone()[0], list(conn.iterdump())
