"""The SQLite ledger's schema: its DDL (version 4), and what an open file holds.

One definition of the tables (`SCHEMA`), read back for every check (`expected`): the
opener's schema check and repair (`onceq._ledger.db`) and the migration from older
schemas (`onceq._ledger.migrate`) both build on it, so neither imports the other's
caller.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3

VERSION = 4
KNOWN = (0, 2, 3, 4)  # the versions this onceq opens (0, 2 and 3 are migrated to 4)

# A source's tag in dead_ops.transport (and messages.source): a short lowercase
# identifier. Its SHAPE is checked, not a list of the sources onceq has: a new source
# (nats) must not need a ledger migration, and a malformed tag (a typo, a queue name
# passed by mistake) is still refused by the database itself. The same rule three
# times: here for SQLite (GLOB: no regular expressions in plain SQLite), in
# `onceq._ledger.pg.schema` for PostgreSQL, and `onceq._ledger.ops.TRANSPORT_TAG`
# before the INSERT (a clear ValueError rather than a constraint error).
TRANSPORT_CHECK = (
    "length(transport) BETWEEN 1 AND 32 AND transport GLOB '[a-z]*'"
    " AND transport NOT GLOB '*[^a-z0-9_]*'"
)

# No ';' inside a comment: the migration runs this DDL statement by statement.
# WITHOUT ROWID: `messages` is only ever reached by its key, so the rows live in the
# primary key's own B-tree (one tree to write per message, not a table and an index).
SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    flow              TEXT NOT NULL,             -- the flow's name: dedup is per flow
    msg_id            TEXT NOT NULL,
    grp               TEXT,                      -- the flow's group field (order_no, claimId)
    seq               INTEGER,                   -- the flow's sequence field
    kept              TEXT NOT NULL DEFAULT '{}',-- the flow's keep paths, a JSON object
    partner_duplicate INTEGER NOT NULL DEFAULT 0,-- the partner said it already had it
    processed_at      TEXT NOT NULL,             -- UTC, ISO 8601
    source            TEXT NOT NULL,             -- the source's tag: dirq, amqp, nats …
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
    transport   TEXT NOT NULL CHECK (TRANSPORT_CHECK),
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
""".replace("TRANSPORT_CHECK", TRANSPORT_CHECK)

# Tables a schema-4 ledger may lack and that are added in place on open, without a
# version bump: they hold no rule of the ledger (a running consumer's published state,
# `onceq._ops.heartbeat`), so an older onceq of the same schema keeps opening the file and
# ignores them, and an operator can still go back one release.
ADDITIVE = ("consumers",)


def tables(conn: sqlite3.Connection) -> dict[str, set[str]]:
    """Each table's column names, read in one statement (one consistent snapshot)."""
    out: dict[str, set[str]] = {}
    for table, column in conn.execute(
        "SELECT m.name, c.name FROM sqlite_master AS m, pragma_table_info(m.name) AS c"
        " WHERE m.type = 'table'"
    ):
        out.setdefault(table, set()).add(column)
    return out


@functools.cache
def expected(schema: str = SCHEMA) -> dict[str, set[str]]:
    """The tables and columns `schema` makes (read from the DDL: one definition)."""
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        conn.executescript(schema)
        return tables(conn)


def user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def missing_columns(have: dict[str, set[str]], want: dict[str, set[str]]) -> list[str]:
    """What of `want` is not in `have`: 'table T' or 'T.column', in schema order."""
    return [f"table {t}" for t in want if t not in have] + [
        f"{t}.{c}" for t in want if t in have for c in sorted(want[t] - have[t])
    ]
