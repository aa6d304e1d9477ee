"""The group commit, once for every kind of ledger: `GroupCommit`.

The algorithm is here; a kind of database (`onceq._ledger.sqlite.Ledger`,
`onceq._ledger.pg.ledger.PgLedger`) supplies only what differs, through the abstract
methods below: how a row is built and checked, how a transaction and a savepoint
are made, how the group's dedup rows go in, how the SQL effect's calls are
guarded, and how one row's fault is told from the database's.

One group, one durable transaction, in this order:

1. each success's `messages` row is built and checked before the transaction: one
   message's value the database cannot store is refused alone (ledger-refused);
2. the group's dedup rows go in (`_insert_rows`: ON CONFLICT DO NOTHING, what comes
   back took effect, every other copy became a DUPLICATE);
3. the flow's SQL effect runs for each copy that won its row
   (`onceq._ledger.sql_step`), a savepoint per message: one that fails is undone
   alone, row and all;
4. a second copy in this group that lost to a winner whose effect then failed
   shares the winner's verdict (it took no effect either);
5. a `duplicates` row per refused copy and a `failures` row per failed one, unless a
   crashed run already recorded this very copy (`recovered`).

If one entry's data still fails the group (a value the check missed, a constraint),
the group is undone and written again entry by entry, each in a savepoint of its
own: the guilty one becomes a dead letter, the innocent ones commit. The
database's own trouble (I/O, disk, schema, a lost connection it cannot wait out)
fails the whole group with LedgerError: nothing settles, every copy comes back.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from onceq._core.effect import SqlEffect
from onceq._core.entry import Entry
from onceq._core.transport import DUPLICATE, REJECTED, SUCCESS, TRANSIENT
from onceq._ledger import sql_step
from onceq._ledger.ops import utcnow
from onceq._ledger.rows import Tx, failure_recorded, record_duplicate, record_failure

__all__ = ["GroupCommit"]


class GroupCommit(ABC):
    """The one group commit; a ledger kind implements the abstract methods."""

    flow: str
    source: str
    sql: SqlEffect | None
    # What a SQL effect's function raises that refuses its message (sql-rejected),
    # besides `Reject`: the driver's integrity error (a constraint of the business rows).
    REJECTS: ClassVar[tuple[type[Exception], ...]] = ()

    if TYPE_CHECKING:
        path: Path | str

        def failures_in(self, conn: Tx, msg_id: str | None) -> int: ...

    # --- the algorithm ----------------------------------------------------------------

    def commit(self, entries: Iterable[Entry]) -> None:
        """Record a group of outcomes in one durable transaction (see the module)."""
        now = utcnow()
        entries = list(entries)
        self._build_rows(entries, now)
        states = [e._state() for e in entries]
        tried = False

        def attempt() -> None:
            nonlocal tried
            if tried:  # a try cut short (a lost connection): its verdicts are undone
                _restore(entries, states)
            tried = True
            try:
                with self._group_transaction() as tx:
                    self._write_entries(tx, entries, now)
            except Exception as exc:
                if self._row_fault(exc) is None:
                    raise
                # The check above missed one entry's data (a new field, a new type) or
                # a constraint refused a row: undone as a whole, the group is written
                # again entry by entry; the guilty one becomes a dead letter.
                _restore(entries, states)
                with self._group_transaction() as tx:
                    for e in entries:
                        self._write_alone(tx, e, now)

        self._attempts(attempt)

    def _write_alone(self, tx: Tx, e: Entry, now: str) -> None:
        try:
            with self._savepoint(tx):
                self._write_entries(tx, [e], now)
        except Exception as exc:
            detail = self._row_fault(exc)
            if detail is None:
                raise
            e._refuse(detail)
            self._write_entries(tx, [e], now)  # its failure row: every text in it is made safe

    def _write_entries(self, tx: Tx, entries: list[Entry], now: str) -> None:
        won, lost = self._insert_rows(tx, [e for e in entries if e.kind is SUCCESS])
        sql_step.apply(self, tx, won)
        if lost and any(w.kind is not SUCCESS for w in won):
            # A second copy in this group lost to a winner whose effect then failed:
            # it took no effect either, so it shares the verdict (never acked as done).
            failed = {w.delivery.msg_id: w for w in won if w.kind is not SUCCESS}
            for e in lost:
                if (w := failed.get(e.delivery.msg_id)) is not None:
                    sql_step.same_verdict(e, w)
        for e in entries:
            if e.kind is DUPLICATE:
                record_duplicate(tx, self.flow, self.source, e, now)
            elif e.kind in (REJECTED, TRANSIENT):
                if failure_recorded(tx, self.flow, self.source, e):
                    e.recovered = True
                else:
                    record_failure(tx, self.flow, self.source, e, now)

    def _build_rows(self, entries: list[Entry], now: str) -> None:
        """Build each success's row (`_build_row`); a kind may do it in one loop of its own."""
        for e in entries:
            if e.kind is SUCCESS:
                # Built once here, checked as it is built: one message's value that the
                # database cannot bind (an int over 64 bits, a lone surrogate, a NUL on
                # PostgreSQL) would fail the whole group, so it is refused alone.
                problem = self._build_row(e, now)
                if problem:
                    e._refuse(problem)

    # --- what a kind of database supplies ----------------------------------------------

    @abstractmethod
    def _build_row(self, e: Entry, now: str) -> str:
        """Set e.row (its `messages` row); why it cannot be stored, or ''."""

    @abstractmethod
    def _attempts(self, attempt: Callable[[], None]) -> None:
        """Run `attempt()` until it goes through (PostgreSQL waits out a lost
        connection and a deadlock; SQLite runs it once)."""

    @abstractmethod
    def _group_transaction(self) -> AbstractContextManager[Tx]:
        """The group's one durable transaction: committed when the block ends, rolled
        back when it raises."""

    @abstractmethod
    def _savepoint(self, tx: Tx) -> AbstractContextManager[None]:
        """A savepoint inside the group's transaction: released when the block ends,
        rolled back to (and released) when it raises."""

    @abstractmethod
    def _row_fault(self, exc: BaseException) -> str | None:
        """The refusal's detail when `exc` is one row's fault (its values, a
        constraint); None when it is the database's (the group fails as one)."""

    @abstractmethod
    def _insert_rows(self, tx: Tx, group: list[Entry]) -> tuple[list[Entry], list[Entry]]:
        """Insert the group's dedup rows; (won, lost): every lost entry is a DUPLICATE."""

    @abstractmethod
    def _run_bulk(self, tx: Tx, sql: SqlEffect, won: list[Entry]) -> None:
        """The SQL effect's one-statement-per-group form (the presets') for `won`."""

    @abstractmethod
    def _effects_guarded(self, tx: Tx) -> AbstractContextManager[None]:
        """While the SQL effect's functions run: a function cannot end the group's
        transaction (SQLite: an authorizer; PostgreSQL: the commit guard trigger)."""

    @abstractmethod
    def _call_effect(
        self, tx: Tx, function: Callable[[Any, Any], None], doc: Any
    ) -> Exception | None:
        """`function(connection, doc)` in a savepoint of its own: None when it returned
        (its rows kept), what it raised when it raised (its rows undone). Raises for
        the database's own failure and for a function that ended the transaction."""


def _restore(entries: list[Entry], states: list[tuple[Any, ...]]) -> None:
    for e, state in zip(entries, states, strict=True):
        e._restore(state)
