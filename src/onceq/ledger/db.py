"""The ledger's database: its schema and the connection settings the guarantees need.

`connect` opens (and, when asked, creates) a ledger with WAL, synchronous=FULL and a
long busy timeout, and refuses a database of another schema before writing to it.
A ledger of onceq 0.1.0 (no schema version) or of schema 2 is migrated in place on
first open (`onceq.ledger.migrate`). The record-keeping itself is `onceq.ledger.sqlite.Ledger`.

The schema carries its version in `PRAGMA user_version` (a field of the file's
header, written in the same transaction as the tables): 0 is 0.1.0's (or no onceq
ledger yet), 2 is issue 7's (flows), 3 is this one (retry delays, replays that reset
a message's attempts, the dead-letter operations' audit). A version above ours is a
newer onceq's ledger and is refused: writing to a schema we do not know could break
its rules silently.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
from pathlib import Path

from onceq.errors import LedgerError, NotFound

VERSION = 3
KNOWN = (0, 2, 3)  # the versions this onceq opens (0 and 2 are migrated to 3)

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
    consumer   TEXT NOT NULL,             -- host:pid:n (onceq.ops.heartbeat)
    host       TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    started_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,             -- older than 3 x every_s: the consumer died
    every_s    REAL NOT NULL,             -- how often it publishes
    state      TEXT NOT NULL DEFAULT '{}',-- JSON: status, breaker, in_flight, connected …
    PRIMARY KEY (flow, consumer)
);
"""

# Tables a schema-3 ledger may lack and that are added in place on open, without a
# version bump: they hold no rule of the ledger (a running consumer's published state,
# `onceq.ops.heartbeat`), so an older onceq of the same schema keeps opening the file and
# ignores them, and an operator can still go back one release.
ADDITIVE = ("consumers",)

BUSY_TIMEOUT_MS = 120_000


def deny_attach(action: int, *_: object) -> int:
    return sqlite3.SQLITE_DENY if action == sqlite3.SQLITE_ATTACH else sqlite3.SQLITE_OK


def check_folder(path: str | Path) -> None:
    """LedgerError unless the folder that is to hold the ledger `path` exists.

    The folder is never created: a mistyped --db or EAI_MQ_DB would otherwise start a
    new, empty ledger in front of an existing queue, and every message it then sees
    takes effect again. The defaults (QDIR/ledger.db, the lab's processed.db) live in
    folders that exist already.
    """
    folder = Path(path).parent
    # exists(), not is_dir(): a file in the folder's place is sqlite's to refuse
    # ("cannot open the ledger"), as any other unopenable path.
    if not folder.exists():
        raise LedgerError(
            f"{folder}: no such folder for the ledger {Path(path).name} (not created: a"
            " mistyped path would start an empty ledger and apply every message again)"
        )


def connect(path: str | Path, *, create: bool = True) -> sqlite3.Connection:
    """Open the ledger with the settings every guarantee depends on."""
    return connect_or_create(path, create=create)[0]


def connect_or_create(path: str | Path, *, create: bool = True) -> tuple[sqlite3.Connection, bool]:
    """(connection, whether this call made the ledger's tables: a ledger that has seen
    nothing). With create=False a missing file is NotFound; with create=True a missing
    folder is LedgerError (`check_folder`). A 0.1.0 ledger is migrated first."""
    from onceq.ledger.migrate import migrate

    p = Path(path)
    if not create and not p.exists():
        raise NotFound(f"{p}: no ledger database here")
    if create:
        check_folder(p)
    try:
        conn = sqlite3.connect(
            str(p), isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False
        )
    except (sqlite3.Error, OSError) as exc:
        raise _cannot_open(p, exc) from exc
    try:
        # Checked before the first write (the WAL switch below writes a header): a file
        # that is not our ledger is refused exactly as it was found.
        state = _check_schema(conn, p, create=create)
        # WAL lets readers (lag, report, the duplicate pre-check) run beside the writer.
        conn.execute("PRAGMA journal_mode=WAL")
        # FULL: the commit is on disk before we move a file or ack a delivery.
        # NORMAL would make a power cut able to lose a commit whose file sits in done/.
        conn.execute("PRAGMA synchronous=FULL")
        # Several consumers queue for the write lock instead of failing "database is locked".
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        if state == "new":
            # One transaction: a concurrent opener never sees half a schema, nor tables
            # without their version.
            conn.executescript(f"BEGIN IMMEDIATE;{SCHEMA}PRAGMA user_version={VERSION};COMMIT;")
        elif state == "old":
            migrate(conn, p)
        elif "consumers" not in tables(conn):
            _add_tables(conn)
    except (sqlite3.Error, OSError, LedgerError) as exc:
        # Close now: a sqlite3 connection sits in a reference cycle (its statement
        # cache), so left alone it would keep the file open until a garbage collection.
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        conn.close()
        if isinstance(exc, LedgerError):
            raise
        raise _cannot_open(p, exc) from exc
    return conn, state == "new"


def _add_tables(conn: sqlite3.Connection) -> None:
    """Make the ADDITIVE tables a schema-3 ledger lacks, in one transaction (a
    concurrent opener waits for the write lock, then finds them: IF NOT EXISTS)."""
    ddl = ";".join(s for s in SCHEMA.split(";") if any(f" {t} (" in s for t in ADDITIVE))
    conn.executescript(f"BEGIN IMMEDIATE;{ddl};COMMIT;")


def _cannot_open(p: Path, exc: BaseException) -> LedgerError:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return LedgerError(f"{p}: cannot open the ledger: {reason}")


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


def _check_schema(conn: sqlite3.Connection, p: Path, *, create: bool) -> str:
    """'new' (no onceq tables yet: to be made), 'ours' (schema 3) or 'old' (0.1.0's or
    schema 2: to be migrated); LedgerError for anything else.

    A database with a `processed` table of other columns (the seed's tutorial ledger)
    would refuse every insert, and a refused insert reads as a refused *message*: each
    good message would be quarantined. It is refused as a whole.
    """
    from onceq.ledger.migrate import V1_TABLES, V2_TABLES

    version = user_version(conn)
    if version > VERSION:
        raise LedgerError(
            f"{p}: written by a newer onceq (ledger schema {version}; this onceq knows"
            f" up to {VERSION}); upgrade onceq"
        )
    have = tables(conn)
    if version == VERSION:
        want = {t: c for t, c in expected().items() if t not in ADDITIVE or t in have}
        missing = missing_columns(have, want)
        if missing:
            raise LedgerError(
                f"{p}: a damaged ledger (schema {VERSION}, missing {', '.join(missing)})"
            )
        return "ours"
    if version == 2:
        missing = missing_columns(have, V2_TABLES)
        if missing:
            raise LedgerError(f"{p}: a damaged ledger (schema 2, missing {', '.join(missing)})")
        return "old"
    if version not in KNOWN:
        raise LedgerError(f"{p}: an unknown ledger schema {version} (this onceq knows 0, 2, 3)")
    ours = [t for t in (*expected(), *V1_TABLES) if t in have]
    if create and not ours:
        return "new"  # a new database (or someone else's) that we may create our tables in
    if not ours:
        raise LedgerError(f"{p}: not an onceq ledger (no table messages or processed)")
    missing = missing_columns(have, V1_TABLES)
    if missing:
        raise LedgerError(
            f"{p}: a ledger of another schema (missing {', '.join(missing)});"
            " use a new --db or migrate it"
        )
    return "old"
