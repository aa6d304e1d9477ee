"""The SQL effect's step of a group commit: business rows in the ledger's transaction.

This is the inbox pattern: the business rows a flow writes (`SqlEffect`) and the
dedup row that says the message took effect are one transaction, so after any
crash either both are on disk or neither is. No idempotent partner is needed.

Once for both kinds of ledger (`onceq._ledger.commit.GroupCommit` calls it; the kind
supplies the savepoint and the guard). The group's functions run under one savepoint
where the kind can (SQLite); when one raises, that is undone and they run again, a
savepoint per message: a function that raises is undone alone (its own rows, and the
dedup row the group's insert gave it) and the rest of the group commits. What it
raised decides the verdict, through the loop's `RetryPolicy.decide` with the entry's
attempt:

| raised                                          | Kind      | reason       |
| Reject, the driver's IntegrityError             | REJECTED  | sql-rejected |
| Retry                                           | TRANSIENT | retry        |
| any other exception (a ProgrammingError, a bug) | TRANSIENT | sql-error    |
| the database's own error (I/O, full, busy, readonly, a lost connection …)
                                                  | the whole group fails (LedgerError) |

A function must not end the transaction: the kind's guard refuses it while the
functions run (SQLite: an authorizer denies BEGIN/COMMIT/ROLLBACK; PostgreSQL: a
trigger fails a COMMIT), and the group fails with LedgerError if one tried, or if
the transaction is gone anyway.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from onceq._core.effect import Reject, Retry
from onceq._core.entry import Entry
from onceq._core.retry import RetryPolicy
from onceq._core.transport import REJECTED, SUCCESS, TRANSIENT, Kind

if TYPE_CHECKING:
    from onceq._ledger.commit import GroupCommit
    from onceq._ledger.rows import Tx

DETAIL_MAX = 200


def apply(ledger: GroupCommit, tx: Tx, won: list[Entry]) -> None:
    """Run the ledger's SQL effect for the entries whose dedup row this group inserted.

    Duplicates never get here: only a copy that won its primary key runs the effect.
    """
    sql = ledger.sql
    if sql is None or not won:
        return
    if sql.bulk is not None:
        ledger._run_bulk(tx, sql, won)
    function = sql.function
    todo = [e for e in won if e.kind is SUCCESS] if function is not None else []
    if function is None or not todo:
        return
    with ledger._effects_guarded(tx):
        # First the whole group under one savepoint (a kind that can: SQLite); only
        # when a function raises is that undone and each message run again in a
        # savepoint of its own, so a group where none fails pays no savepoint per
        # message. Either way a raising function's rows go alone.
        at_once = getattr(ledger, "_call_effects_at_once", None)
        docs = [e.fields.get("doc") or {} for e in todo]  # _doc, inline: per message
        if at_once is not None and at_once(tx, function, docs):
            return
        for e in todo:
            raised = ledger._call_effect(tx, function, _doc(e))
            if raised is not None:
                _failed(ledger, tx, e, raised)


def _doc(e: Entry) -> Any:
    return e.fields.get("doc") or {}


def _failed(ledger: GroupCommit, tx: Tx, e: Entry, raised: Exception) -> None:
    """`e`'s function raised (its rows are undone): its dedup row goes too, and the
    failure is decided like any other."""
    undo_row(ledger, tx, e)
    kind, reason, detail = verdict(raised, ledger.REJECTS)
    e.attempt = ledger.failures_in(tx, e.delivery.msg_id) + 1
    e.kind, e.reason, e.detail, e.recovered = kind, reason, detail, False
    # The loop's own policy; an Entry made without one (a direct Ledger user) gets the
    # old rule, `max_attempts` tries without delays, from the same table.
    policy = e.policy or RetryPolicy(immediate=max(e.max_attempts, 1) - 1, delays=())
    after = raised.after if isinstance(raised, Retry) else None  # Retry(after=…)
    e.settle, e.delivery.delay = policy.decide(kind, e.attempt, after)


def verdict(exc: Exception, rejects: tuple[type[Exception], ...] = ()) -> tuple[Kind, str, str]:
    """(kind, reason, detail) of an exception raised by a SQL effect's function;
    `rejects`: the driver's integrity errors (a business row's constraint)."""
    if isinstance(exc, (Reject, *rejects)):
        return REJECTED, "sql-rejected", short(str(exc) or "rejected")
    if isinstance(exc, Retry):
        return TRANSIENT, "retry", short(str(exc))
    return TRANSIENT, "sql-error", short(f"{type(exc).__name__}: {exc}")


def short(text: str) -> str:
    return " ".join(text.split())[:DETAIL_MAX]


def undo_row(ledger: GroupCommit, tx: Tx, e: Entry) -> None:
    """Take back the dedup row this group inserted for `e`: its effect did not happen."""
    tx.execute(
        "DELETE FROM messages WHERE flow = ? AND msg_id = ?", (ledger.flow, e.delivery.msg_id)
    )


def same_verdict(loser: Entry, winner: Entry) -> None:
    """A second copy in the group shares its winner's failure: it took no effect either."""
    loser.kind, loser.settle = winner.kind, winner.settle
    loser.reason, loser.detail, loser.attempt = winner.reason, winner.detail, winner.attempt
