"""The SQL effect's step of a group commit: business rows in the ledger's transaction.

This is the inbox pattern: the business rows a flow writes (`SqlEffect`) and the
dedup row that says the message took effect are one transaction, so after any
crash either both are on disk or neither is. No idempotent partner is needed.

Per message, a SAVEPOINT: a function that raises is undone alone (its own rows, and
the dedup row the group's bulk insert gave it) and the rest of the group commits.
What it raised decides the verdict, through the loop's `RetryPolicy.decide` with the
entry's attempt:

| raised                                   | Kind      | reason       |
| Reject, sqlite3.IntegrityError           | REJECTED  | sql-rejected |
| Retry                                    | TRANSIENT | retry        |
| any other exception                      | TRANSIENT | sql-error    |
| the database's own error (I/O, full, busy, readonly …) | the whole group fails (LedgerError) |

A function must not end the transaction: an authorizer denies BEGIN/COMMIT/ROLLBACK
while it runs (so a stray COMMIT cannot make half a group durable), and the group
fails with LedgerError if it tried, or if the transaction is gone anyway.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

from onceq.core.effect import Reject, Retry, SqlEffect
from onceq.core.retry import RetryPolicy
from onceq.core.transport import Kind
from onceq.core.values import is_data_error
from onceq.errors import LedgerError

if TYPE_CHECKING:
    from onceq.ledger.sqlite import Entry, Ledger

DETAIL_MAX = 200

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
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.Error) and code is not None and code & 0xFF in _DATABASE_FAULTS


class _TxGuard:
    """An authorizer that denies ending the transaction, and remembers an attempt."""

    def __init__(self) -> None:
        self.tried = False

    def __call__(self, action: int, *_: object) -> int:
        if action == sqlite3.SQLITE_TRANSACTION:
            self.tried = True
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK


def apply(ledger: Ledger, conn: sqlite3.Connection, won: list[Entry]) -> None:
    """Run the ledger's SQL effect for the entries whose dedup row this group inserted.

    Duplicates never get here: only a copy that won its primary key runs the effect.
    """
    sql: SqlEffect | None = ledger.sql
    if sql is None or not won:
        return
    if sql.bulk is not None:
        _bulk(ledger, conn, sql, won)
    if sql.function is not None:
        # One authorizer for the group's functions: setting one expires every prepared
        # statement, so once per message would re-prepare the user's INSERT each time.
        guard = _TxGuard()
        conn.set_authorizer(guard)
        try:
            for e in won:
                if e.kind is Kind.SUCCESS:
                    _run_one(ledger, conn, sql, e, guard)
        finally:
            conn.set_authorizer(None)


def _bulk(ledger: Ledger, conn: sqlite3.Connection, sql: SqlEffect, won: list[Entry]) -> None:
    """The presets' form: one statement for the whole group; row by row only when refused."""
    assert sql.bulk is not None
    try:
        sql.bulk(conn, won)
        return
    except Exception as exc:
        if not conn.in_transaction or not _row_fault(exc):
            raise
    # A statement that breaks a constraint is undone alone (SQLite keeps the
    # transaction): find the message it refused, one savepoint each.
    for e in won:
        conn.execute("SAVEPOINT onceq_bulk")
        try:
            sql.bulk(conn, [e])
        except Exception as exc:
            if not conn.in_transaction or not _row_fault(exc):
                raise
            conn.execute("ROLLBACK TO onceq_bulk")
            _undo_row(ledger, conn, e)
            # The presets' wording of 0.1.0: the ledger could not record this message.
            e._refuse(f"{type(exc).__name__}: {str(exc)[:120]}")
        conn.execute("RELEASE onceq_bulk")


def _row_fault(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.IntegrityError) or is_data_error(exc)


def _run_one(
    ledger: Ledger, conn: sqlite3.Connection, sql: SqlEffect, e: Entry, guard: _TxGuard
) -> None:
    assert sql.function is not None
    conn.execute("SAVEPOINT onceq_effect")
    raised: Exception | None = None
    try:
        sql.function(conn, e.fields.get("doc") or {})
    except Exception as exc:
        raised = exc
    if guard.tried or not conn.in_transaction:
        raise LedgerError(
            f"{ledger.path}: the SQL effect ended the ledger's transaction (it must not"
            " COMMIT or ROLLBACK: onceq commits its rows with the message's record)"
        )
    if raised is None:
        conn.execute("RELEASE onceq_effect")
        return
    if database_fault(raised):
        raise raised  # the ledger's trouble: the group fails as one, nothing settles
    conn.execute("ROLLBACK TO onceq_effect")
    conn.execute("RELEASE onceq_effect")
    _undo_row(ledger, conn, e)
    kind, reason, detail = verdict(raised)
    e.attempt = ledger.failures_in(conn, e.delivery.msg_id) + 1
    e.kind, e.reason, e.detail, e.recovered = kind, reason, detail, False
    # The loop's own policy; an Entry made without one (a direct Ledger user) gets the
    # old rule, `max_attempts` tries without delays, from the same table.
    policy = e.policy or RetryPolicy(immediate=max(e.max_attempts, 1) - 1, delays=())
    after = raised.after if isinstance(raised, Retry) else None  # Retry(after=…)
    e.settle, e.delivery.delay = policy.decide(kind, e.attempt, after)


def verdict(exc: Exception) -> tuple[Kind, str, str]:
    """(kind, reason, detail) of an exception raised by a SQL effect's function."""
    if isinstance(exc, Reject | sqlite3.IntegrityError):
        return Kind.REJECTED, "sql-rejected", _short(str(exc) or "rejected")
    if isinstance(exc, Retry):
        return Kind.TRANSIENT, "retry", _short(str(exc))
    return Kind.TRANSIENT, "sql-error", _short(f"{type(exc).__name__}: {exc}")


def _short(text: str) -> str:
    return " ".join(text.split())[:DETAIL_MAX]


def _undo_row(ledger: Ledger, conn: sqlite3.Connection, e: Entry) -> None:
    """Take back the dedup row this group inserted for `e`: its effect did not happen."""
    conn.execute(
        "DELETE FROM messages WHERE flow = ? AND msg_id = ?", (ledger.flow, e.delivery.msg_id)
    )


def same_verdict(loser: Entry, winner: Any) -> None:
    """A second copy in the group shares its winner's failure: it took no effect either."""
    loser.kind, loser.settle = winner.kind, winner.settle
    loser.reason, loser.detail, loser.attempt = winner.reason, winner.detail, winner.attempt
