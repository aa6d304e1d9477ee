"""Migrating an older ledger to schema 4, in place, in one transaction.

From onceq 0.1.0 (schema 0). 0.1.0 kept one dedup table for one kind of message:
`processed(msg_id PRIMARY KEY, order_no, seq, amount, …)`. Schema 2 and 3 deduplicate
per flow in `messages`, and `processed` becomes the exercise's business table, which
the presets' SQL effect (`onceq._exercise.processed_table`) keeps writing. So the migration

- copies every `processed` row into `messages` under the flow 'default' (the flow
  of every CLI run and preset), grp = order_no, kept = {"amount": amount} when set:
  the same queue keeps refusing the same ids after the upgrade;
- rebuilds duplicates, failures and replays with a `flow` column ('default'), their
  ids kept (error.csv picks the newest failure by id);
- leaves `processed` as it is, rows and all.

From schema 2 (issue 7's flows): failures gains delay_s, replays gain msg_id, op and
reset_after, the table dead_ops is made (ALTER TABLE ADD COLUMN: no row is copied).

Both: every old replay gets the msg_id of the newest failure of its file (ref) before
it, and reset_after = that msg_id's newest failure before it, so a replay made before
the upgrade gives its message its retries again exactly as one made after does.
These two paths make dead_ops with schema 4's DDL directly.

From schema 3 (issue 21): dead_ops.transport checked a list of sources (amqp, dirq),
so every new source needed a migration; schema 4 checks the tag's shape
(`onceq._ledger.schema.TRANSPORT_CHECK`). SQLite cannot drop a CHECK: dead_ops is
rebuilt, SQLite's own recipe (https://sqlite.org/lang_altertable.html, "other kinds
of table schema changes"): the new table made under another name by schema 4's DDL,
the rows copied with their ids (replays.op names them), the old table dropped, the
new one renamed, then the indexes and triggers an operator had put on it made again
from their own SQL. A dead_ops with columns schema 3 never had is refused, as a
0.1.0 ledger's are below: a copy would drop them silently.
Then user_version = 4.

All of it between BEGIN IMMEDIATE and COMMIT: a crash, a full disk or a statement
that fails midway leaves the file exactly as it was (SQLite rolls back DDL too), and
two processes that open the same old ledger at once migrate it once: the second
waits for the write lock, then finds version 3 and does nothing. A 0.1.0 ledger
whose tables hold columns 0.1.0 never had is refused: its rows mean something we do
not know, and dropping a column in a copy would lose it silently.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from onceq._ledger.schema import ADDITIVE, SCHEMA, VERSION, expected, tables, user_version
from onceq.errors import LedgerError

# The 0.1.0 tables and their columns (git show 036b324:src/onceq/ledger_db.py).
V1_TABLES: dict[str, set[str]] = {
    "processed": {"msg_id", "order_no", "seq", "amount", "processed_at", "source", "ref"},
    "duplicates": {"msg_id", "ref", "seen_at"},
    "failures": {"id", "msg_id", "ref", "source", "reason", "detail", "attempt", "action", "at"},
    "replays": {"id", "ref", "at"},
}

# Schema 2's tables and columns (git show 357c42a:src/onceq/ledger_db.py).
V2_TABLES: dict[str, set[str]] = {
    "messages": {"flow", "msg_id", "grp", "seq", "kept", "partner_duplicate", "processed_at"}
    | {"source", "ref"},
    "duplicates": {"flow", "msg_id", "ref", "seen_at"},
    "failures": {"id", "flow", "msg_id", "ref", "source", "reason", "detail", "attempt"}
    | {"action", "at"},
    "replays": {"id", "flow", "ref", "at"},
}

FLOW = "default"

# Each statement in order. The old tables are renamed aside, the new ones made by
# the current schema's own DDL (one definition), the rows copied, the old tables dropped.
_RENAME = """
ALTER TABLE duplicates RENAME TO onceq_v0_duplicates;
ALTER TABLE failures RENAME TO onceq_v0_failures;
ALTER TABLE replays RENAME TO onceq_v0_replays;
DROP INDEX IF EXISTS failures_msg;
DROP INDEX IF EXISTS failures_ref;
"""
_COPY = """
INSERT INTO messages (flow, msg_id, grp, seq, kept, partner_duplicate, processed_at, source, ref)
    SELECT 'default', msg_id, order_no, seq,
           CASE WHEN amount IS NULL THEN '{}' ELSE json_object('amount', amount) END,
           0, processed_at, source, ref
    FROM processed;
INSERT INTO duplicates (flow, msg_id, ref, seen_at)
    SELECT 'default', msg_id, ref, seen_at FROM onceq_v0_duplicates;
INSERT INTO failures (id, flow, msg_id, ref, source, reason, detail, attempt, action, at)
    SELECT id, 'default', msg_id, ref, source, reason, detail, attempt, action, at
    FROM onceq_v0_failures;
INSERT INTO replays (id, flow, ref, at) SELECT id, 'default', ref, at FROM onceq_v0_replays;
DROP TABLE onceq_v0_duplicates;
DROP TABLE onceq_v0_failures;
DROP TABLE onceq_v0_replays;
"""

# Schema 2 → 3 (then 4): columns added (defaults for the old rows), the new table and index
# made by the current schema's own DDL (CREATE … IF NOT EXISTS skips the tables that exist).
_ADD = """
ALTER TABLE failures ADD COLUMN delay_s REAL;
ALTER TABLE replays ADD COLUMN msg_id TEXT;
ALTER TABLE replays ADD COLUMN op INTEGER;
ALTER TABLE replays ADD COLUMN reset_after INTEGER NOT NULL DEFAULT 0;
"""

# Both paths, last: an old replay names only its file. Its msg_id is the newest
# failure of that file (in its flow) recorded before the replay; its reset_after is
# that msg_id's newest failure before the replay ('at' is ISO 8601 UTC text, which
# sorts as time does).
_RESET = """
UPDATE replays SET msg_id = (
    SELECT f.msg_id FROM failures AS f
    WHERE f.flow = replays.flow AND f.ref = replays.ref AND f.at <= replays.at
    ORDER BY f.id DESC LIMIT 1
) WHERE msg_id IS NULL;
UPDATE replays SET reset_after = coalesce((
    SELECT max(f.id) FROM failures AS f
    WHERE f.flow = replays.flow AND f.msg_id = replays.msg_id AND f.at <= replays.at
), 0) WHERE msg_id IS NOT NULL AND reset_after = 0;
"""


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


# Schema 3's tables and columns: schema 4's (only a CHECK changed), the ADDITIVE ones
# (consumers) may be missing.
V3_TABLES: dict[str, set[str]] = {t: c for t, c in expected().items() if t not in ADDITIVE}
_NEW_DEAD_OPS = "onceq_v4_dead_ops"


def _rebuild_dead_ops(conn: sqlite3.Connection, path: Path) -> list[str]:
    """The statements that rebuild a schema-3 dead_ops with schema 4's CHECK."""
    unknown = sorted(tables(conn)["dead_ops"] - V3_TABLES["dead_ops"])
    if unknown:
        raise LedgerError(
            f"{path}: cannot migrate this ledger to schema {VERSION}: columns onceq never"
            f" wrote in dead_ops ({', '.join(unknown)}); it is left as it was"
        )
    # Read before the DROP, which takes them with it. sql IS NULL: an index SQLite
    # made itself (a UNIQUE or PRIMARY KEY's), which the new DDL makes again.
    kept = [
        sql
        for (sql,) in conn.execute(
            "SELECT sql FROM sqlite_master WHERE tbl_name = 'dead_ops'"
            " AND type IN ('index', 'trigger') AND sql IS NOT NULL ORDER BY type, name"
        )
    ]
    (ddl,) = [s for s in _statements(SCHEMA) if "EXISTS dead_ops (" in s]
    columns = ", ".join(sorted(V3_TABLES["dead_ops"]))
    return [
        # No IF NOT EXISTS: a table of that name already there fails the migration
        # instead of receiving the rows.
        ddl.replace("IF NOT EXISTS dead_ops (", f"{_NEW_DEAD_OPS} ("),
        f"INSERT INTO {_NEW_DEAD_OPS} ({columns}) SELECT {columns} FROM dead_ops",
        "DROP TABLE dead_ops",
        f"ALTER TABLE {_NEW_DEAD_OPS} RENAME TO dead_ops",
        *kept,
    ]


def migrate(conn: sqlite3.Connection, path: Path) -> bool:
    """Migrate the 0.1.0, schema-2 or schema-3 ledger on `conn` to schema 4; False when
    another process already did. LedgerError, with the file unchanged, when it cannot be done."""
    # execute(), never executescript(): executescript commits a pending transaction
    # first, which would make the migration two transactions.
    conn.execute("BEGIN IMMEDIATE")
    old = "an older"
    try:
        # Read again under the write lock: another opener may have migrated it meanwhile.
        version = user_version(conn)
        if version == VERSION:
            conn.execute("COMMIT")
            return False
        old = "an onceq 0.1.0" if version == 0 else f"a schema-{version}"
        if version == 0:
            have = tables(conn)
            unknown = [f"{t}.{c}" for t, cols in V1_TABLES.items() for c in sorted(have[t] - cols)]
            if unknown:
                raise LedgerError(
                    f"{path}: cannot migrate this ledger to schema {VERSION}: columns onceq"
                    f" 0.1.0 never wrote ({', '.join(unknown)}); it is left as it was"
                )
            steps = (*_statements(_RENAME), *_statements(SCHEMA), *_statements(_COPY))
        elif version == 2:
            steps = (*_statements(_ADD), *_statements(SCHEMA))
        elif version == 3:
            # SCHEMA after the rebuild: makes the ADDITIVE tables a schema-3 ledger may
            # lack (IF NOT EXISTS skips the others). _RESET finds nothing left to do.
            steps = (*_rebuild_dead_ops(conn, path), *_statements(SCHEMA))
        else:  # checked by the caller; a concurrent writer of another version
            raise LedgerError(f"{path}: an unknown ledger schema {version}; left as it was")
        for sql in (*steps, *_statements(_RESET)):
            conn.execute(sql)
        # user_version is a field of the file header: written in this transaction.
        conn.execute(f"PRAGMA user_version={VERSION}")
        conn.execute("COMMIT")
    except BaseException as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if isinstance(exc, LedgerError):
            raise
        if isinstance(exc, sqlite3.Error):
            raise LedgerError(
                f"{path}: cannot migrate {old} ledger to schema {VERSION}: {exc};"
                " it is left as it was"
            ) from exc
        raise
    return True
