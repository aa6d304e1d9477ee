"""The ledger's database: its schema and the connection settings the guarantees need.

`connect` opens (and, when asked, creates) a ledger with WAL, synchronous=FULL and a
long busy timeout, and refuses a database of another schema before writing to it.
The record-keeping itself is `onceq.ledger.Ledger`.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
from pathlib import Path

from onceq.errors import LedgerError, NotFound

SCHEMA = """
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
    folder is LedgerError (`check_folder`)."""
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
        new = _check_schema(conn, p, create=create)
        # WAL lets readers (lag, report, the duplicate pre-check) run beside the writer.
        conn.execute("PRAGMA journal_mode=WAL")
        # FULL: the commit is on disk before we move a file or ack a delivery.
        # NORMAL would make a power cut able to lose a commit whose file sits in done/.
        conn.execute("PRAGMA synchronous=FULL")
        # Several consumers queue for the write lock instead of failing "database is locked".
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        if create:
            # One transaction: a concurrent opener never sees half a schema.
            conn.executescript(f"BEGIN IMMEDIATE;{SCHEMA}COMMIT;")
    except (sqlite3.Error, OSError, LedgerError) as exc:
        # Close now: a sqlite3 connection sits in a reference cycle (its statement
        # cache), so left alone it would keep the file open until a garbage collection.
        conn.close()
        if isinstance(exc, LedgerError):
            raise
        raise _cannot_open(p, exc) from exc
    return conn, new


def _cannot_open(p: Path, exc: BaseException) -> LedgerError:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return LedgerError(f"{p}: cannot open the ledger: {reason}")


def _tables(conn: sqlite3.Connection) -> dict[str, set[str]]:
    """Each table's column names, read in one statement (one consistent snapshot)."""
    tables: dict[str, set[str]] = {}
    for table, column in conn.execute(
        "SELECT m.name, c.name FROM sqlite_master AS m, pragma_table_info(m.name) AS c"
        " WHERE m.type = 'table'"
    ):
        tables.setdefault(table, set()).add(column)
    return tables


@functools.cache
def _expected() -> dict[str, set[str]]:
    """The tables and columns SCHEMA makes (read from SCHEMA: one definition)."""
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        conn.executescript(SCHEMA)
        return _tables(conn)


def _check_schema(conn: sqlite3.Connection, p: Path, *, create: bool) -> bool:
    """Raise LedgerError unless p holds our tables (or, with create, none of them yet);
    True when it holds none yet (a new ledger: its tables are to be made).

    A database with a `processed` table of other columns (the seed's tutorial ledger,
    an older onceq) would refuse every insert, and a refused insert reads as a refused
    *message*: each good message would be quarantined. It is refused as a whole.
    """
    have = _tables(conn)
    ours = [t for t in _expected() if t in have]
    if create and not ours:
        return True  # a new database (or someone else's) that we may create our tables in
    if not ours:
        raise LedgerError(f"{p}: not an onceq ledger (no table processed)")
    missing = [f"table {t}" for t in _expected() if t not in have] + [
        f"{t}.{c}" for t in ours for c in sorted(_expected()[t] - have[t])
    ]
    if missing:
        raise LedgerError(
            f"{p}: a ledger of another schema (missing {', '.join(missing)});"
            " use a new --db or migrate it"
        )
    return False
