"""The ledger's database: opening it with the connection settings the guarantees need.

The tables themselves are `onceq._ledger.schema` (re-exported here).

`connect` opens (and, when asked, creates) a ledger with WAL, synchronous=FULL and a
long busy timeout, and refuses a database of another schema before writing to it.
A ledger of onceq 0.1.0 (no schema version), of schema 2 or of schema 3 is migrated
in place on first open (`onceq._ledger.migrate`). The record-keeping itself is
`onceq._ledger.sqlite.Ledger`.

The schema carries its version in `PRAGMA user_version` (a field of the file's
header, written in the same transaction as the tables): 0 is 0.1.0's (or no onceq
ledger yet), 2 is issue 7's (flows), 3 added retry delays, replays that reset a
message's attempts and the dead-letter operations' audit, 4 is this one (dead_ops
checks a source tag's shape, not a list of sources). A version above ours is a
newer onceq's ledger and is refused: writing to a schema we do not know could break
its rules silently.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from onceq._ledger.migrate import V1_TABLES, V2_TABLES, V3_TABLES, migrate
from onceq._ledger.schema import (
    ADDITIVE,
    KNOWN,
    SCHEMA,
    VERSION,
    expected,
    missing_columns,
    tables,
    user_version,
)
from onceq.errors import LedgerError, NotFound

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
        # that is not our ledger is refused exactly as it was found. In one read
        # transaction: the version and the tables from one snapshot, else a process
        # creating the ledger at this moment shows us its tables with the old version
        # (0: "a ledger of another schema").
        conn.execute("BEGIN")
        state = _check_schema(conn, p, create=create)
        conn.execute("COMMIT")
        # WAL lets readers (lag, report, the duplicate pre-check) run beside the writer.
        _to_wal(conn)
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


def _to_wal(conn: sqlite3.Connection) -> None:
    """Switch the file to WAL (kept in the file: once one opener did, the rest find it).

    A file still in rollback mode needs its exclusive lock for the switch, and while
    another process creates the ledger SQLite may answer "database is locked" at once,
    without waiting on its busy timeout (measured: 1 open in 180 when three processes
    open a new ledger together). So the switch is asked again, for as long as the busy
    timeout would have waited.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _check_schema(conn: sqlite3.Connection, p: Path, *, create: bool) -> str:
    """'new' (no onceq tables yet: to be made), 'ours' (schema 4) or 'old' (0.1.0's,
    schema 2 or 3: to be migrated); LedgerError for anything else.

    A database with a `processed` table of other columns (the seed's tutorial ledger)
    would refuse every insert, and a refused insert reads as a refused *message*: each
    good message would be quarantined. It is refused as a whole.
    """
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
    if version in (2, 3):
        missing = missing_columns(have, V2_TABLES if version == 2 else V3_TABLES)
        if missing:
            raise LedgerError(
                f"{p}: a damaged ledger (schema {version}, missing {', '.join(missing)})"
            )
        return "old"
    if version not in KNOWN:
        raise LedgerError(
            f"{p}: an unknown ledger schema {version}"
            f" (this onceq knows {', '.join(map(str, KNOWN))})"
        )
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
