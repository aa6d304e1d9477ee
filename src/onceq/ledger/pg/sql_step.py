"""The SQL effect's step of a PostgreSQL group commit (see `onceq.ledger.sql_step`: the same
inbox pattern, the same verdict table, with PostgreSQL's errors).

Per message a savepoint (a nested `conn.transaction()`): a function that raises is
undone alone, its rows and the dedup row the group's insert gave it, and the rest of
the group commits. What it raised decides the verdict:

| raised                                          | Kind      | reason       |
| Reject, psycopg.IntegrityError                  | REJECTED  | sql-rejected |
| Retry                                           | TRANSIENT | retry        |
| any other exception (a ProgrammingError, a bug) | TRANSIENT | sql-error    |
| the database's own error (OperationalError: connection, disk full,
  shutdown; InternalError)                        | the whole group fails    |

A function must not end the transaction: the group fails with LedgerError when,
after its call, the connection is no longer inside the group's transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import psycopg
from psycopg.pq import TransactionStatus

from onceq.core.effect import Reject, SqlEffect
from onceq.core.retry import RetryPolicy
from onceq.core.transport import Kind
from onceq.errors import LedgerError
from onceq.ledger.sql_step import verdict as sqlite_verdict

if TYPE_CHECKING:
    from onceq.ledger.pg.ledger import PgLedger
    from onceq.ledger.pg.sql import PgTx
    from onceq.ledger.sqlite import Entry

DETAIL_MAX = 200


def database_fault(exc: BaseException) -> bool:
    """Is `exc` the database's own failure (it would fail any message the same way)?"""
    return isinstance(exc, psycopg.OperationalError | psycopg.InternalError)


def verdict(exc: Exception) -> tuple[Kind, str, str]:
    """(kind, reason, detail) of an exception raised by a SQL effect's function."""
    if isinstance(exc, psycopg.IntegrityError):
        return Kind.REJECTED, "sql-rejected", " ".join(str(exc).split())[:DETAIL_MAX]
    return sqlite_verdict(exc)


class _Undo(Exception):
    """Leaves the message's savepoint by rolling it back."""


def apply(ledger: PgLedger, tx: PgTx, won: list[Entry]) -> None:
    """Run the ledger's SQL effect for the entries whose dedup row this group inserted."""
    sql: SqlEffect | None = ledger.sql
    if sql is None or not won:
        return
    if sql.bulk is not None:
        # The presets' form: one statement for the group. A refused row raises, the
        # transaction is aborted and PgLedger.commit writes the group entry by entry.
        sql.bulk(tx, won)
    if sql.function is not None and any(e.kind is Kind.SUCCESS for e in won):
        # Armed for the functions' run (see schema.py: commit_guard): a COMMIT sent by
        # one of them now fails at the server, so no part of the group becomes durable.
        tx.conn.execute(_ARM)
        for e in won:
            if e.kind is Kind.SUCCESS:
                _run_one(ledger, tx, sql, e)
        tx.conn.execute(_DISARM)


# One round trip each (several statements, no parameters: psycopg sends them as one).
_ARM = (
    "SELECT set_config('onceq.commit_ok', 'no', true);"
    " INSERT INTO onceq.commit_guard (armed) VALUES (1)"
)
_DISARM = "SELECT set_config('onceq.commit_ok', 'yes', true); DELETE FROM onceq.commit_guard"


def _ended(exc: BaseException | None) -> bool:
    """Did the function try to end the transaction through psycopg's own methods? (They
    refuse inside a transaction block; the SQL COMMIT is the guard's.)"""
    return isinstance(exc, psycopg.ProgrammingError) and "forbidden" in str(exc)


def _run_one(ledger: PgLedger, tx: PgTx, sql: SqlEffect, e: Entry) -> None:
    assert sql.function is not None
    conn = tx.conn
    raised: Exception | None = None
    try:
        with conn.transaction():
            try:
                sql.function(conn, e.fields.get("doc") or {})
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
                    f"{ledger.path}: the SQL effect ended the ledger's transaction (it must"
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
    if raised is None:
        return
    tx.execute(
        "DELETE FROM messages WHERE flow = ? AND msg_id = ?", (ledger.flow, e.delivery.msg_id)
    )
    kind, reason, detail = verdict(raised)
    e.attempt = ledger.failures_in(tx, e.delivery.msg_id) + 1
    e.kind, e.reason, e.detail, e.recovered = kind, reason, detail, False
    policy = e.policy or RetryPolicy(immediate=max(e.max_attempts, 1) - 1, delays=())
    after = getattr(raised, "after", None)
    e.settle, e.delivery.delay = policy.decide(kind, e.attempt, after)


__all__ = ["Reject", "apply", "database_fault", "verdict"]
