"""What SQLite supplies to the one group commit (`onceq._ledger.commit.GroupCommit`).

- the transaction: BEGIN IMMEDIATE on the writer (`Ledger._transaction`), run once:
  a local file has no connection to wait for;
- a savepoint is SAVEPOINT/ROLLBACK TO/RELEASE; a statement that breaks a constraint
  is undone alone and the transaction stays (SQLite's ON CONFLICT ABORT), so the dedup
  insert of a group of up to EXACT_ROWS rows without a SQL effect is first tried plain
  (`_insert_new`: every row new, the usual case); a group it refuses, a larger one and
  a SQL-effect flow's go through `onceq._ledger.rows.record_successes` (RETURNING, then
  row by row in place);
- one row's fault is a value that could not be bound (`is_data_error`), raised as it
  is or as the cause of the LedgerError the transaction made of it;
- the SQL effect's functions run under an authorizer that denies BEGIN, COMMIT and
  ROLLBACK (a stray COMMIT would make half a group durable); the database's own
  failures (`database_fault`: I/O, full, busy, readonly …) fail the group.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from onceq._core.effect import SqlEffect
from onceq._core.entry import Entry
from onceq._core.transport import SUCCESS
from onceq._core.values import is_data_error
from onceq._ledger.commit import GroupCommit
from onceq._ledger.rows import Tx, build_row, record_successes
from onceq._ledger.sql_step import undo_row
from onceq.errors import LedgerError

if TYPE_CHECKING:
    pass

# Primary result codes that are the database's trouble, not the message's.
_DATABASE_FAULTS = {
    sqlite3.SQLITE_PERM,
    sqlite3.SQLITE_BUSY,
    sqlite3.SQLITE_LOCKED,
    sqlite3.SQLITE_NOMEM,
    sqlite3.SQLITE_READONLY,
    sqlite3.SQLITE_INTERRUPT,
    sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_CORRUPT,
    sqlite3.SQLITE_FULL,
    sqlite3.SQLITE_CANTOPEN,
    sqlite3.SQLITE_PROTOCOL,
    sqlite3.SQLITE_NOTADB,
}


def database_fault(exc: BaseException) -> bool:
    """Is `exc` the database's own failure (it would fail any message the same way)?"""
    code = getattr(exc, "sqlite_errorcode", None)  # not set on the module's own errors
    return isinstance(exc, sqlite3.Error) and code is not None and code & 0xFF in _DATABASE_FAULTS


class _TxGuard:
    """An authorizer that, while `active`, denies ending the transaction and remembers
    an attempt.

    Installed once on the writer, at the first group with a SQL effect's function, and
    never removed: setting an authorizer expires every prepared statement, so setting
    and clearing it around each group made every statement (the ledger's own too) be
    prepared again in every group. SQLite asks an authorizer when it prepares a
    statement, so a statement the writer's cache keeps is checked once per text, and
    a transaction statement prepared while `active` is refused (and never cached).
    The ledger ends its own transactions through `commit()`/`rollback()` and begins
    them through `executescript`, none of which goes into that cache: no cached
    BEGIN, COMMIT or ROLLBACK prepared while inactive can be reused by a function.
    """

    def __init__(self) -> None:
        self.active = False
        self.tried = False

    def __call__(self, action: int, *_: object) -> int:
        if action == sqlite3.SQLITE_TRANSACTION and self.active:
            self.tried = True
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK


class SqliteCommit(GroupCommit):
    """The SQLite side of the group commit (a base of `onceq._ledger.sqlite.Ledger`)."""

    REJECTS = (sqlite3.IntegrityError,)
    _tx_guard: _TxGuard | None = None

    if TYPE_CHECKING:
        _write: sqlite3.Connection

        def _transaction(self) -> contextlib.AbstractContextManager[sqlite3.Connection]: ...

    def _build_row(self, e: Entry, now: str) -> str:
        return build_row(e, self.flow, self.source, now)

    def _build_rows(self, entries: list[Entry], now: str) -> None:
        # `GroupCommit._build_rows` with `build_row` called straight: one Python call
        # per message instead of two (per message, in the thread holding the GIL).
        flow, source = self.flow, self.source
        for e in entries:
            if e.kind is SUCCESS:
                problem = build_row(e, flow, source, now)
                if problem:
                    e._refuse(problem)

    def _attempts(self, attempt: Callable[[], None]) -> None:
        attempt()

    def _group_transaction(self) -> contextlib.AbstractContextManager[Tx]:
        return self._transaction()

    @contextlib.contextmanager
    def _savepoint(self, tx: Tx) -> Iterator[None]:
        conn = self._write
        conn.execute("SAVEPOINT entry")
        try:
            yield
        except BaseException:
            if conn.in_transaction:  # else the transaction is gone: the group fails
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK TO entry")
                    conn.execute("RELEASE entry")
            raise
        conn.execute("RELEASE entry")

    def _row_fault(self, exc: BaseException) -> str | None:
        cause = exc.__cause__ if isinstance(exc, LedgerError) else exc
        if not is_data_error(cause):
            return None
        return f"{type(exc).__name__}: {str(exc)[:120]}"

    def _insert_rows(self, tx: Tx, group: list[Entry]) -> tuple[list[Entry], list[Entry]]:
        """The group's `messages` rows: one plain multi-row INSERT; a group it refuses
        goes through `record_successes` (RETURNING tells who won).

        Why not RETURNING at once: the commit runs in a thread beside the loop, and the
        sqlite3 module lets go of the GIL around every step of a statement, one step per
        row RETURNING hands back. The loop takes the GIL at each, and this thread then
        waits for it back: two thread hand-offs per message (futex, context switches)
        where a plain INSERT makes one per group. A plain INSERT that meets a row already
        there (a duplicate, a second copy in the group) or any other constraint fails
        as a whole and is undone alone, the transaction kept (SQLite's ON CONFLICT
        ABORT): that group then goes the way it always went, so every verdict is the
        same as before.
        """
        if not group or self.sql is not None or len(group) > EXACT_ROWS:
            # Measured slower there (callgrind, dirq_profile): with a SQL effect 128k ->
            # 140k instructions per file, and the directory queue's groups of up to 256
            # 112k -> 122k; not taken there until that is understood.
            return record_successes(tx, group)
        conn = self._write
        try:
            # One text per group size (at most EXACT_ROWS, each prepared once and kept by
            # the connection's statement cache of 128).
            conn.execute(_insert_new(len(group)), _new_args(group))
        except sqlite3.Error:
            if not conn.in_transaction:
                raise  # the transaction is gone: the group fails as one
            return record_successes(tx, group)
        return list(group), []

    def _run_bulk(self, tx: Tx, sql: SqlEffect, won: list[Entry]) -> None:
        """One statement for the whole group; row by row only when refused."""
        assert sql.bulk is not None
        conn = self._write
        try:
            sql.bulk(conn, won)
            return
        except Exception as exc:
            if not conn.in_transaction or not _bulk_row_fault(exc):
                raise
        # A statement that breaks a constraint is undone alone (SQLite keeps the
        # transaction): find the message it refused, one savepoint each.
        for e in won:
            conn.execute("SAVEPOINT onceq_bulk")
            try:
                sql.bulk(conn, [e])
            except Exception as exc:
                if not conn.in_transaction or not _bulk_row_fault(exc):
                    raise
                conn.execute("ROLLBACK TO onceq_bulk")
                undo_row(self, tx, e)
                # The presets' wording of 0.1.0: the ledger could not record this message.
                e._refuse(f"{type(exc).__name__}: {str(exc)[:120]}")
            conn.execute("RELEASE onceq_bulk")

    @contextlib.contextmanager
    def _effects_guarded(self, tx: Tx) -> Iterator[None]:
        guard = self._tx_guard
        if guard is None:
            self._tx_guard = guard = _TxGuard()
            self._write.set_authorizer(guard)  # once: it stays for the connection's life
        guard.active, guard.tried = True, False
        try:
            yield
        finally:
            guard.active = False

    def _call_effects_at_once(
        self, tx: Tx, function: Callable[[Any, Any], None], docs: list[Any]
    ) -> bool:
        """Every `function(connection, doc)` under one savepoint: True when none raised
        (their rows kept); False when one raised, with all their rows undone (the
        caller runs them again one by one). Raises as `_call_effect` does."""
        conn, guard = self._write, self._tx_guard
        assert guard is not None, "under _effects_guarded"
        conn.execute("SAVEPOINT onceq_effects")
        for doc in docs:
            try:
                function(conn, doc)
            except Exception as exc:
                self._check_transaction(conn)
                if database_fault(exc):
                    raise  # the ledger's trouble: the group fails as one
                conn.execute("ROLLBACK TO onceq_effects")
                conn.execute("RELEASE onceq_effects")
                return False
            # After each: none runs outside the transaction (a function that swallowed
            # an error SQLite answered with a rollback would leave the next one in a
            # transaction of its own). `_check_transaction`'s test, inline: per message.
            if guard.tried or not conn.in_transaction:
                self._check_transaction(conn)  # raises
        conn.execute("RELEASE onceq_effects")
        return True

    def _check_transaction(self, conn: sqlite3.Connection) -> None:
        guard = self._tx_guard
        if (guard is not None and guard.tried) or not conn.in_transaction:
            raise LedgerError(
                f"{self.path}: the SQL effect ended the ledger's transaction (it must not"
                " COMMIT or ROLLBACK: onceq commits its rows with the message's record)"
            )

    def _call_effect(
        self, tx: Tx, function: Callable[[Any, Any], None], doc: Any
    ) -> Exception | None:
        conn = self._write
        conn.execute("SAVEPOINT onceq_effect")
        raised: Exception | None = None
        try:
            function(conn, doc)
        except Exception as exc:
            raised = exc
        self._check_transaction(conn)
        if raised is None:
            conn.execute("RELEASE onceq_effect")
            return None
        if database_fault(raised):
            raise raised  # the ledger's trouble: the group fails as one, nothing settles
        conn.execute("ROLLBACK TO onceq_effect")
        conn.execute("RELEASE onceq_effect")
        return raised


# Groups up to this size are inserted by one plain statement (`SqliteCommit._insert_rows`):
# a broker flow's groups are at most its prefetch (the default 5 to 50).
EXACT_ROWS = 64


@functools.cache
def _insert_new(rows: int) -> str:
    """`onceq._ledger.rows._insert_many` without ON CONFLICT and RETURNING: one text per
    size (up to EXACT_ROWS), its columns and parameters in the same order."""
    row = "(?1,?2,?3,?,?,?,?,?,?)"
    return (
        "INSERT INTO messages (processed_at, flow, source, msg_id, grp, seq, kept,"
        f" partner_duplicate, ref) VALUES {','.join([row] * rows)}"
    )


def _new_args(group: Sequence[Entry]) -> list[Any]:
    # e.row: (flow, msg_id, grp, seq, kept, partner_duplicate, at, source, ref);
    # processed_at, flow and source are the group's, bound once.
    r = group[0].row
    args: list[Any] = [r[6], r[0], r[7]]
    for e in group:
        r = e.row
        args += (r[1], r[2], r[3], r[4], r[5], r[8])
    return args


def _bulk_row_fault(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.IntegrityError) or is_data_error(exc)
