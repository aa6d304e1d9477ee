"""The idempotency ledger: SQLite, one row per message id that took effect.

The primary key of `processed` is what makes consumption effectively once: the
second copy of a message finds its row and is refused by the database, not by an
`if` that two processes could both pass. Everything else recorded about a message
(a duplicate sighting, a failure and what was done about it) is written in the
same transaction as that row, and the transport settles (moves the file, acks the
delivery) only after the transaction is durable.

Only the consume loop writes here (plus `replay`, which records a human's action).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from onceq.errors import LedgerError
from onceq.ledger_db import connect, connect_or_create, deny_attach
from onceq.ledger_values import is_data_error, text, unstorable
from onceq.transport import Delivery, Kind, Settle

# Rows per multi-row INSERT: 7 parameters each stays far below SQLite's limit of
# 32766 bound parameters; one statement instead of one per message.
BULK_ROWS = 500


def utcnow() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


@dataclass(eq=False)
class Entry:
    """One delivery's outcome on its way into the ledger.

    The loop fills kind/settle/reason; `commit` may turn a SUCCESS into a
    DUPLICATE (another process won the primary key) or into REJECTED (the
    business write failed), and says so in `kind`, `settle` and `reason`.
    """

    delivery: Delivery
    kind: Kind
    settle: Settle
    reason: str = ""
    detail: str = ""
    attempt: int = 1
    fields: dict[str, Any] = field(default_factory=dict)
    recovered: bool = False  # the row already names this very copy: a crash after commit

    def _state(self) -> tuple[Any, ...]:
        return (self.kind, self.settle, self.reason, self.detail, self.recovered)

    def _restore(self, state: tuple[Any, ...]) -> None:
        self.kind, self.settle, self.reason, self.detail, self.recovered = state

    def _refuse(self, detail: str) -> None:
        """The ledger cannot record this success: it becomes a dead letter, with why."""
        self.kind, self.settle, self.recovered = Kind.REJECTED, Settle.DEAD, False
        self.reason, self.detail = "ledger-refused", detail


class Ledger:
    """The ledger at `path`. `source` tags rows ('dirq', 'amqp').

    With create=True a missing file is made (never its folder: LedgerError), and
    `created` says so; with create=False it is NotFound.
    """

    def __init__(self, path: str | Path, source: str = "dirq", *, create: bool = True) -> None:
        self.path = Path(path)
        self.source = source
        # `created`: this open made the ledger, so it has seen no message. The caller
        # says so: a new ledger in front of an old queue applies every message again.
        self._write, self.created = connect_or_create(self.path, create=create)
        # A second connection for reads, so a read never waits on (or runs inside) the
        # writer's transaction when the loop commits from a worker thread.
        try:
            self._read = connect(self.path, create=False)
        except BaseException:
            self._write.close()
            raise

    def close(self) -> None:
        self._write.close()
        self._read.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- reads ----------------------------------------------------------------------

    def processed_ref(self, msg_id: str) -> str | None:
        """The ref that took effect for msg_id, '' when it has none, None when unseen."""
        row = self._q1("SELECT ref FROM processed WHERE msg_id = ?", (msg_id,))
        return None if row is None else (row[0] or "")

    def failed_attempts(self, msg_id: str) -> int:
        row = self._q1("SELECT count(*) FROM failures WHERE msg_id = ?", (msg_id,))
        return int(row[0]) if row else 0

    def counts(self) -> dict[str, int]:
        out = {}
        for table in ("processed", "duplicates", "failures", "replays"):
            out[table] = int(self._q1(f"SELECT count(*) FROM {table}", ())[0])
        return out

    def duplicate_ids(self) -> list[str]:
        rows = self._rows("SELECT DISTINCT msg_id FROM duplicates ORDER BY msg_id")[1]
        return [r[0] for r in rows]

    def last_failure(self, ref: str) -> tuple[str, str] | None:
        """(reason, detail) of the newest failure recorded for `ref`."""
        row = self._q1(
            "SELECT reason, detail FROM failures WHERE ref = ? ORDER BY id DESC LIMIT 1",
            (text(ref),),
        )
        return None if row is None else (row[0], row[1])

    def dead_letters(self) -> list[dict[str, Any]]:
        cols, rows = self._rows(
            "SELECT msg_id, ref, reason, detail, attempt, at FROM failures"
            " WHERE action = 'dead' ORDER BY id"
        )
        return [dict(zip(cols, r, strict=True)) for r in rows]

    def query(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run a read-only query (order checks); returns (columns, rows)."""
        try:
            # query_only refuses writes to this database; the authorizer also refuses
            # ATTACH, through which a query could create or write another file.
            self._read.set_authorizer(deny_attach)
            self._read.execute("PRAGMA query_only=ON")
            cur = self._read.execute(sql)
            cols = [c[0] for c in cur.description or ()]
            return cols, cur.fetchall()
        except sqlite3.Error as exc:
            raise LedgerError(f"{self.path}: query failed: {exc}") from exc
        finally:
            self._read.set_authorizer(None)
            self._read.execute("PRAGMA query_only=OFF")

    def _rows(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        try:
            cur = self._read.execute(sql)
            return [c[0] for c in cur.description], cur.fetchall()
        except sqlite3.Error as exc:
            raise LedgerError(f"{self.path}: read failed: {exc}") from exc

    def _q1(self, sql: str, args: Sequence[Any]) -> tuple[Any, ...] | None:
        try:
            return self._read.execute(sql, args).fetchone()
        except sqlite3.Error as exc:
            raise LedgerError(f"{self.path}: read failed: {exc}") from exc

    # --- writes ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        conn = self._write
        try:
            # IMMEDIATE takes the write lock up front: two consumers queue here (busy
            # timeout) instead of deadlocking on a read lock upgraded to a write.
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise LedgerError(f"{self.path}: cannot begin a transaction: {exc}") from exc
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise LedgerError(f"{self.path}: write failed: {exc}") from exc
            raise

    def commit(self, entries: Iterable[Entry]) -> None:
        """Record a group of outcomes in one durable transaction.

        SUCCESS inserts the `processed` row with ON CONFLICT DO NOTHING; no row back
        means another copy got there first, and the entry becomes a DUPLICATE (or
        `recovered`, when the row names this very copy). A business write that the
        database refuses is undone alone and that entry is rejected; the rest of the
        group commits. A failure that a crashed run already recorded for this very
        copy is not recorded twice (`recovered`). A success whose values SQLite cannot
        bind (`onceq.ledger_values`) becomes a dead letter, reason ledger-refused, and
        the rest of its group commits; a database error (I/O, disk, schema) is the
        ledger's and fails the whole group with LedgerError.
        """
        now = utcnow()
        entries = list(entries)
        for e in entries:
            if e.kind is Kind.SUCCESS:
                # One message's value that SQLite cannot bind (an int over 64 bits, a
                # lone surrogate) would fail the whole group: it is refused alone.
                problem = self._unstorable(e, now)
                if problem:
                    e._refuse(problem)
        states = [e._state() for e in entries]
        try:
            with self._transaction() as conn:
                self._write_entries(conn, entries, now)
        except (LedgerError, OverflowError, UnicodeError, TypeError, ValueError) as exc:
            if not is_data_error(exc.__cause__ if isinstance(exc, LedgerError) else exc):
                raise
            # The check above missed one entry's data (a new field, a new type): undone
            # as a whole, the group is written again entry by entry, the guilty one
            # becomes a dead letter and the innocent ones commit.
            for e, state in zip(entries, states, strict=True):
                e._restore(state)
            with self._transaction() as conn:
                for e in entries:
                    self._write_alone(conn, e, now)

    def _unstorable(self, e: Entry, now: str) -> str:
        columns = ("msg_id", "order_no", "seq", "amount")
        for name, value in zip(columns, self._row(e, now), strict=False):
            why = unstorable(value)
            if why:
                return f"{name}: {why}"
        return ""

    def _write_alone(self, conn: sqlite3.Connection, e: Entry, now: str) -> None:
        conn.execute("SAVEPOINT entry")
        try:
            self._write_entries(conn, [e], now)
        except Exception as exc:
            if not is_data_error(exc):
                raise
            conn.execute("ROLLBACK TO entry")
            e._refuse(f"{type(exc).__name__}: {str(exc)[:120]}")
            self._write_entries(conn, [e], now)  # its failure row: every text in it is made safe
        conn.execute("RELEASE entry")

    def _write_entries(self, conn: sqlite3.Connection, entries: list[Entry], now: str) -> None:
        self._record_successes(conn, [e for e in entries if e.kind is Kind.SUCCESS], now)
        for e in entries:
            if e.kind is Kind.DUPLICATE:
                self._record_duplicate(conn, e, now)
            elif e.kind in (Kind.REJECTED, Kind.TRANSIENT):
                if self._failure_recorded(conn, e):
                    e.recovered = True
                    continue
                conn.execute(
                    "INSERT INTO failures (msg_id, ref, source, reason, detail, attempt,"
                    " action, at) VALUES (?,?,?,?,?,?,?,?)",
                    (
                        # A failure row is the record of a message that went wrong, so
                        # nothing in it may be refused: texts go through `text`.
                        text(e.delivery.msg_id),
                        text(e.delivery.ref),
                        self.source,
                        text(e.reason),
                        text(e.detail),
                        e.attempt,
                        "requeue" if e.settle is Settle.REQUEUE else "dead",
                        now,
                    ),
                )

    def _record_successes(self, conn: sqlite3.Connection, group: list[Entry], now: str) -> None:
        """Insert the `processed` rows of a group, many per statement.

        One multi-row INSERT … ON CONFLICT DO NOTHING RETURNING per chunk: the rows
        it returns are the copies that took effect; every other entry lost to the
        primary key (an earlier row, or an earlier copy in the same statement) and
        becomes a DUPLICATE. A chunk in which the database refuses a row, or in which
        two entries could not be told apart by (msg_id, ref), goes row by row.
        """
        for i in range(0, len(group), BULK_ROWS):
            chunk = group[i : i + BULK_ROWS]
            keys = [(e.delivery.msg_id, text(e.delivery.ref)) for e in chunk]
            if len(set(keys)) < len(keys):
                for e in chunk:
                    self._record_success(conn, e, now)
                continue
            args: list[Any] = []
            for e in chunk:
                args += self._row(e, now)
            try:
                won = set(
                    conn.execute(
                        "INSERT INTO processed (msg_id, order_no, seq, amount, processed_at,"
                        " source, ref) VALUES "
                        + ",".join(["(?,?,?,?,?,?,?)"] * len(chunk))
                        + " ON CONFLICT(msg_id) DO NOTHING RETURNING msg_id, ref",
                        args,
                    ).fetchall()
                )
            except sqlite3.Error:
                if not conn.in_transaction:
                    raise
                for e in chunk:  # the statement was undone: find the row it refused
                    self._record_success(conn, e, now)
                continue
            for e, key in zip(chunk, keys, strict=True):
                if key not in won:  # the primary key refused a second copy
                    e.kind, e.settle = Kind.DUPLICATE, Settle.ACK

    def _row(self, e: Entry, now: str) -> tuple[Any, ...]:
        """The `processed` row of a successful entry, in INSERT column order."""
        f = e.fields
        return (
            e.delivery.msg_id,
            f.get("order_no"),
            f.get("seq"),
            f.get("amount"),
            now,
            self.source,
            text(e.delivery.ref),
        )

    def _record_success(self, conn: sqlite3.Connection, e: Entry, now: str) -> None:
        # No SAVEPOINT around the insert (it cost two statements per message): when a
        # statement breaks a constraint, SQLite undoes that statement alone and keeps
        # the transaction (ON CONFLICT ABORT), which is exactly what a savepoint
        # would give. Only a constraint (a CHECK, a trigger's RAISE) refuses *this
        # message*; any other error (disk full, I/O, a broken trigger or schema) is the
        # ledger's and is re-raised: the group fails as one and its files stay for the
        # next run, instead of every good message being quarantined.
        try:
            row = conn.execute(
                "INSERT INTO processed (msg_id, order_no, seq, amount, processed_at, source, ref)"
                " VALUES (?,?,?,?,?,?,?) ON CONFLICT(msg_id) DO NOTHING RETURNING msg_id",
                self._row(e, now),
            ).fetchone()
        except sqlite3.IntegrityError as exc:
            if not conn.in_transaction:
                raise
            e.kind, e.settle = Kind.REJECTED, Settle.DEAD
            e.reason, e.detail = "ledger-refused", str(exc)
            return
        if row is None:  # the primary key refused a second copy
            e.kind = Kind.DUPLICATE
            e.settle = Settle.ACK

    def _failure_recorded(self, conn: sqlite3.Connection, e: Entry) -> bool:
        """Did a crashed run already record this very copy's failure?

        Only a redelivered copy with a stable ref can tell (a file taken over from a
        dead consumer): if its newest failure row is newer than its newest replay,
        the crash fell between that commit and the move to error/, and only the
        move is left to do. Without this, every such crash would add a failure row.
        """
        d = e.delivery
        if not (d.redelivered and d.stable_ref):
            return False
        row = conn.execute(
            "SELECT max(at) FROM failures WHERE ref = ? AND source = ? AND action = 'dead'",
            (text(d.ref), self.source),
        ).fetchone()
        if row is None or row[0] is None:
            return False
        replayed = conn.execute(
            "SELECT max(at) FROM replays WHERE ref = ?", (text(d.ref),)
        ).fetchone()
        return replayed is None or replayed[0] is None or replayed[0] < row[0]

    def _record_duplicate(self, conn: sqlite3.Connection, e: Entry, now: str) -> None:
        row = conn.execute(
            "SELECT ref, source FROM processed WHERE msg_id = ?", (e.delivery.msg_id,)
        ).fetchone()
        d = e.delivery
        if d.stable_ref and row is not None and row[0] == text(d.ref) and row[1] == self.source:
            # The row names this very file: we crashed after the commit and before the
            # move. It is finished work, not a duplicate.
            e.recovered = True
            return
        new = conn.execute(
            "INSERT INTO duplicates (msg_id, ref, seen_at) VALUES (?,?,?)"
            " ON CONFLICT(msg_id, ref) DO NOTHING RETURNING msg_id",
            (e.delivery.msg_id, text(e.delivery.ref), now),
        ).fetchone()
        if new is None and d.stable_ref and d.redelivered:
            # This very copy (a file taken over from a dead consumer) was already
            # recorded as a duplicate before the crash: only its move was left.
            e.recovered = True

    def record_replay(self, ref: str) -> None:
        with self._transaction() as conn:
            conn.execute("INSERT INTO replays (ref, at) VALUES (?,?)", (text(ref), utcnow()))
