"""What PostgreSQL supplies to the one group commit (`onceq._ledger.commit.GroupCommit`).

- the transaction, in two round trips (`Reconnector.transaction`): BEGIN and the
  dedup insert, which returns the transaction id too, then the presets' bulk insert
  queued with the COMMIT, in one pipeline; in ONE round trip when the transaction was
  begun ahead with the last COMMIT (`onceq._ledger.pg.ahead`: its id in hand, the
  insert is not waited for); tried until it goes through (`Reconnector.run_commit`):
  a lost connection is waited out and the same group written again with the same
  `now`, a COMMIT whose answer was lost is looked up, not repeated; a deadlock with
  another consumer's group is retried;
- a savepoint is a nested `conn.transaction()`; a refused row aborts the whole
  transaction (SQLite undoes just the statement), so a group with one is written
  again entry by entry, each in its savepoint;
- one row's fault is psycopg's IntegrityError or DataError, or a value that could not
  be bound, unless the connection itself is gone;
- the SQL effect's functions run with the commit guard armed (`schema.py`: a COMMIT
  sent by one of them fails at the server); the database's own failures
  (OperationalError: connection, disk full, shutdown; InternalError) fail the group.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.pq import TransactionStatus

from onceq._core.effect import SqlEffect
from onceq._core.entry import Entry
from onceq._core.values import is_data_error
from onceq._ledger.commit import GroupCommit
from onceq._ledger.pg.reconnect import Reconnector, is_connection_error
from onceq._ledger.pg.rows import (
    group_insert,
    pg_build_row,
    record_one_by_one,
    split_won,
    strict,
    take_xid,
    with_xid,
)
from onceq._ledger.pg.sql import PgTx
from onceq.errors import LedgerError

if TYPE_CHECKING:
    from onceq._ledger.rows import Tx

# One round trip each (several statements, no parameters: psycopg sends them as one).
_ARM = (
    "SELECT set_config('onceq.commit_ok', 'no', true);"
    " INSERT INTO onceq.commit_guard (armed) VALUES (1)"
)
_DISARM = "SELECT set_config('onceq.commit_ok', 'yes', true); DELETE FROM onceq.commit_guard"
# The largest group whose insert goes out without waiting for its answer: a round trip
# saved is what counts at a small prefetch (small groups); a large group (a directory
# queue's 256) is likelier to hold a copy already recorded, which costs a second try.
OPTIMISTIC_MAX = 32


def row_fault(exc: BaseException) -> bool:
    """Did one message's row fail (its values, a constraint), not the database?"""
    return isinstance(exc, psycopg.IntegrityError | psycopg.DataError) or is_data_error(exc)


def database_fault(exc: BaseException) -> bool:
    """Is `exc` the database's own failure (it would fail any message the same way)?"""
    return isinstance(exc, psycopg.OperationalError | psycopg.InternalError)


def _ended(exc: BaseException | None) -> bool:
    """Did the function try to end the transaction through psycopg's own methods? (They
    refuse inside a transaction block; the SQL COMMIT is the guard's.)"""
    return isinstance(exc, psycopg.ProgrammingError) and "forbidden" in str(exc)


class _GroupTx(PgTx):
    """A group transaction's `PgTx`: its BEGIN is sent with the first statement
    (`Reconnector.begun`), so a statement of the shared queries sends it first."""

    __slots__ = ("_net",)

    def __init__(self, conn: psycopg.Connection[Any], net: Reconnector) -> None:
        super().__init__(conn)
        self._net = net

    def execute(self, sql: str, args: Any = None) -> psycopg.RawCursor[Any]:
        self._net.begin(self.conn)
        return super().execute(sql, args)


class _Undo(Exception):
    """Leaves the message's savepoint by rolling it back."""


class PgCommit(GroupCommit):
    """The PostgreSQL side of the group commit (a base of `PgLedger`)."""

    REJECTS = (psycopg.IntegrityError,)

    if TYPE_CHECKING:
        url: str
        _write: psycopg.Connection[Any]
        _write_lock: threading.RLock
        _net: Reconnector

    _savepoints = 0  # savepoints open in the current group's transaction

    def _build_row(self, e: Entry, now: str) -> str:
        return pg_build_row(e, self.flow, self.source, now)

    def _attempts(self, attempt: Callable[[], None]) -> None:
        # The writer is shared with the operators' writes; run_commit reconnects
        # `self._write` when it is lost and hands the attempt the live one.
        with self._write_lock:
            self._net.run_commit(self, lambda _conn: attempt())

    @contextlib.contextmanager
    def _group_transaction(self) -> Iterator[Tx]:
        conn = self._write
        self._savepoints = 0
        # The next group's transaction is begun with this COMMIT (`onceq._ledger.pg.ahead`)
        # where the group's statements can go out in one pipeline: no function of the
        # user's runs on this connection (it needs each answer on the way).
        self._net.want_ahead = self.sql is None or self.sql.function is None
        with self._net.transaction(conn):
            yield _GroupTx(conn, self._net)

    @contextlib.contextmanager
    def _savepoint(self, tx: Tx) -> Iterator[None]:
        # The BEGIN first, and no pipeline left open: psycopg makes a savepoint only
        # inside a transaction it sees (in an idle autocommit session its transaction()
        # would BEGIN and COMMIT), and it sees one only after a Sync.
        self._net.begin(self._write)
        self._net.sync()
        self._savepoints += 1
        try:
            with self._write.transaction():
                yield
        finally:
            self._savepoints -= 1

    def _row_fault(self, exc: BaseException) -> str | None:
        if self._net.optimistic:
            return None  # tried again the usual way first (`Reconnector.run_commit`)
        if not row_fault(exc) or is_connection_error(exc, self._write):
            return None
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}"

    def _insert_rows(self, tx: Tx, group: list[Entry]) -> tuple[list[Entry], list[Entry]]:
        conn = self._write
        insert = group_insert(group)
        if insert is None:  # nothing to insert, or the careful row-by-row path
            self._net.begin(conn)
            return record_one_by_one(conn, group)
        cur = conn.cursor()
        # The pipeline stays open to the COMMIT unless a function of the user's runs on
        # this connection in between (it needs each answer and the transaction status).
        keep = self.sql is None or self.sql.function is None
        net = self._net
        if keep and net.pre_begun and not self._savepoints and len(group) <= OPTIMISTIC_MAX:
            if net.calm:
                net.calm -= 1
            else:
                # The transaction's id is in hand already (begun ahead): the insert goes
                # out with the rest of the group and its COMMIT, one round trip, without
                # waiting for its answer. It inserts every row or fails (no ON CONFLICT):
                # a copy already recorded fails the try, which is rolled back whole and
                # done again the usual way (`Reconnector.run_commit`). Every copy won.
                net.optimistic = True
                net.tail(conn)
                cur.execute(*strict(*insert))
                return list(group), []
        with net.begun(conn, keep=keep) as first:  # BEGIN and this: one round trip
            cur.execute(*(with_xid(*insert) if first else insert))
        rows = cur.fetchall()
        if first:  # before anything else is queued: see Reconnector.transaction
            net.note_xid(take_xid(rows))
        return split_won(group, rows)

    def _run_bulk(self, tx: Tx, sql: SqlEffect, won: list[Entry]) -> None:
        # The presets' form: one statement for the group. A refused row raises, the
        # transaction is aborted and the group is written again entry by entry.
        assert sql.bulk is not None
        if sql.function is None and not self._savepoints:
            # Nothing after it needs an answer before the COMMIT (no function of the
            # user's runs on this connection: psycopg's pipeline mode defers errors and
            # the transaction status): it goes out with the COMMIT, one round trip.
            # Inside a savepoint (the careful path) everything stays one by one.
            self._net.tail(self._write)  # (the insert's pipeline, when still open)
        else:
            self._net.sync()
        sql.bulk(tx, won)

    @contextlib.contextmanager
    def _effects_guarded(self, tx: Tx) -> Iterator[None]:
        # Armed for the functions' run (see schema.py: commit_guard): a COMMIT sent by
        # one of them now fails at the server, so no part of the group becomes durable.
        # Not disarmed when one raised: the group's transaction fails with it. The
        # functions run one statement at a time (no pipeline: `_call_effect` reads the
        # transaction's status).
        self._net.sync()
        self._write.execute(_ARM)
        yield
        self._write.execute(_DISARM)

    def _call_effect(
        self, tx: Tx, function: Callable[[Any, Any], None], doc: Any
    ) -> Exception | None:
        conn = self._write
        raised: Exception | None = None
        try:
            with conn.transaction():
                try:
                    function(conn, doc)
                except Exception as exc:
                    raised = exc
                if raised is not None and (database_fault(raised) or conn.broken):
                    raise raised  # the ledger's trouble (or its lost session): the group fails
                status = conn.info.transaction_status
                if _ended(raised) or status not in (
                    TransactionStatus.INTRANS,
                    TransactionStatus.INERROR,
                ):
                    raise LedgerError(
                        f"{self.path}: the SQL effect ended the ledger's transaction (it must"
                        " not COMMIT or ROLLBACK: onceq commits its rows with the message's"
                        " record)"
                    )
                if raised is None and status is TransactionStatus.INERROR:
                    # It swallowed a failed statement: what it did is not all there.
                    raised = psycopg.errors.InFailedSqlTransaction(
                        "a statement failed inside the effect (the error was caught)"
                    )
                if raised is not None:
                    raise _Undo
        except _Undo:
            pass
        return raised
