"""The idempotency ledger: SQLite, one row per (flow, message id) that took effect.

The primary key of `messages` is what makes consumption effectively once: the
second copy of a message finds its row and is refused by the database, not by an
`if` that two processes could both pass. Everything else recorded about a message
(a duplicate sighting, a failure and what was done about it, a flow's SQL effect)
is written in the same transaction as that row, and the transport settles (moves
the file, acks the delivery) only after the transaction is durable.

Every read and write is scoped to the ledger's flow: two flows in one file never
refuse each other's ids. Only the consume loop writes here, plus the replays and
dead-letter operations a human runs (`onceq.ledger.ops`: attempts, dead letters,
replays and their audit).
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from json.encoder import encode_basestring as _json_str
from pathlib import Path
from typing import Any

from onceq.core.effect import SqlEffect
from onceq.core.entry import Entry
from onceq.core.inflight import FileGuard, file_guard
from onceq.core.transport import Kind
from onceq.core.values import INT64_MAX, INT64_MIN, is_data_error, is_utf8, text, unstorable
from onceq.errors import LedgerError, UsageError
from onceq.ledger import sql_step as ledger_sql
from onceq.ledger.db import connect, connect_or_create, deny_attach
from onceq.ledger.ops import LedgerOps
from onceq.ledger.rows import failure_recorded, record_duplicate, record_failure, record_successes

# The stored form of `kept`: compact, UTF-8 as it is, no NaN/Infinity (not JSON, and
# SQLite's JSON functions would refuse the row).
_encode_kept = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def encode_kept(kept: dict[str, Any]) -> str:
    """`kept` as stored: exactly `_encode_kept(kept)`, twice as fast for flat ones.

    Per message, in the commit's thread: the encoder's own set-up (a C encoder made
    per call, its circular-reference dict) costs more than encoding one amount. A
    dict of str keys and finite floats, ints and strs is written here with the
    encoder's own pieces (float.__repr__, int.__repr__, encode_basestring); anything
    else (a nested value, None, a bool, NaN) goes to the encoder, which also raises.
    """
    parts = []
    for k, v in kept.items():
        cls = v.__class__
        if cls is float and v - v == 0.0:  # finite: inf - inf and nan - nan are nan
            text = float.__repr__(v)
        elif cls is int:
            text = int.__repr__(v)
        elif cls is str:
            text = _json_str(v)
        else:
            return _encode_kept(kept)
        if k.__class__ is not str:
            return _encode_kept(kept)
        parts.append(_json_str(k) + ":" + text)
    return "{" + ",".join(parts) + "}"


FLOW_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
DEFAULT_FLOW = "default"


def utcnow() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def check_flow_name(name: str) -> str:
    if not isinstance(name, str) or not FLOW_NAME.fullmatch(name):
        raise UsageError(
            f"flow {name!r}: not a flow name (letters, digits, '_', '.', '-';"
            " 1 to 64, starting with a letter or digit)"
        )
    return name


def build_row(e: Entry, flow: str, source: str, now: str) -> str:
    """Set e.row (its `messages` row, INSERT column order); why it cannot be stored, or ''.

    Shared by both ledgers (`onceq.ledger.pg.ledger.PgLedger` adds PostgreSQL's own refusals).
    """
    f = e.fields
    d = e.delivery
    msg_id, grp, seq = d.msg_id, f.get("group"), f.get("seq")
    # Per message, so the usual values (ASCII text, no group, a 64-bit int) pass a
    # test or two inline; anything else gets the full check and its wording.
    if not (
        (msg_id.__class__ is str and msg_id.isascii())
        and (grp is None or (grp.__class__ is str and grp.isascii()))
        and (seq is None or (seq.__class__ is int and INT64_MIN <= seq <= INT64_MAX))
    ):
        for name, value in (("msg_id", msg_id), ("group", grp), ("seq", seq)):
            why = unstorable(value)
            if why:
                return f"{name}: {why}"
    kept_values = f.get("kept")
    if kept_values:
        try:
            kept = encode_kept(kept_values)
        except (TypeError, ValueError) as exc:
            return f"kept: {exc}"
        if not (kept.isascii() or is_utf8(kept)):
            return "kept: text with a lone surrogate"
    else:
        kept = "{}"
    ref = d.ref
    if not (ref.__class__ is str and ref.isascii() and "\x00" not in ref):
        ref = text(ref)
    dup = 1 if f.get("partner_duplicate") else 0
    e.row = (flow, msg_id, grp, seq, kept, dup, now, source, ref)
    return ""


class Ledger(LedgerOps):
    """The ledger at `path`, for the flow `flow`. `source` tags rows ('dirq', 'amqp').

    `sql` is the flow's SQL effect: its `setup` runs when the ledger opens, its
    function (or bulk form) in every group commit. With create=True a missing file is
    made (never its folder: LedgerError), and `created` says so; with create=False it
    is NotFound. A 0.1.0 ledger is migrated on open (`onceq.ledger.migrate`).
    """

    kind = "sqlite"  # PgLedger's is "postgresql": what a caller may branch on, if it must

    def __init__(
        self,
        path: str | Path,
        source: str = "dirq",
        *,
        flow: str = DEFAULT_FLOW,
        sql: SqlEffect | None = None,
        create: bool = True,
    ) -> None:
        self.path = Path(path)
        self.source = source
        self.flow = check_flow_name(flow)
        self.sql = sql
        # `created`: this open made the ledger, so it has seen no message. The caller
        # says so: a new ledger in front of an old queue applies every message again.
        self._write, self.created = connect_or_create(self.path, create=create)
        try:
            if sql is not None and sql.setup:
                self._setup(sql.setup)
            # A second connection for reads, so a read never waits on (or runs inside)
            # the writer's transaction when the loop commits from a worker thread.
            self._read = connect(self.path, create=False)
        except BaseException:
            self._write.close()
            raise

    def _setup(self, ddl: str) -> None:
        try:
            # One transaction: a concurrent opener never sees half of the business tables.
            self._write.executescript(f"BEGIN IMMEDIATE;\n{ddl}\n;COMMIT;")
        except sqlite3.Error as exc:
            if self._write.in_transaction:
                self._write.execute("ROLLBACK")
            raise LedgerError(f"{self.path}: the SQL effect's setup failed: {exc}") from exc

    def close(self) -> None:
        self._write.close()
        self._read.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the consume loop's side (onceq.core.ledger_api.LedgerApi) --------------------

    def ping(self) -> bool:
        """An SQLite file is never away (it has no connection to lose)."""
        return True

    def interrupt(self) -> None:
        """Nothing to interrupt: a commit never waits for a lost database."""

    def inflight_guard(self) -> FileGuard:
        """A byte-range lock per msg_id on `<ledger>-inflight` (onceq.core.inflight)."""
        return file_guard(self.path, self.flow)

    # --- reads (this flow's) ----------------------------------------------------------

    def processed_ref(self, msg_id: str) -> str | None:
        """The ref that took effect for msg_id, '' when it has none, None when unseen."""
        row = self._q1(
            "SELECT ref FROM messages WHERE flow = ? AND msg_id = ?", (self.flow, msg_id)
        )
        return None if row is None else (row[0] or "")

    def processed_refs(self, msg_ids: Iterable[str]) -> dict[str, str]:
        """`processed_ref` of many msg_ids in one read: {msg_id: ref} of those seen.

        For a caller that checks a batch (one loop tick's deliveries): on a
        PostgreSQL ledger one query instead of one round trip per message.
        """
        ids = sorted({m for m in msg_ids if isinstance(m, str)})
        out: dict[str, str] = {}
        for i in range(0, len(ids), 500):  # far below SQLite's 32766 bound parameters
            chunk = ids[i : i + 500]
            rows = self._rows(
                "SELECT msg_id, ref FROM messages WHERE flow = ? AND msg_id IN"
                f" ({','.join('?' * len(chunk))})",
                (self.flow, *chunk),
            )[1]
            out.update((m, r or "") for m, r in rows)
        return out

    async def aprocessed_ref(self, msg_id: str) -> str | None:
        """`processed_ref` for the event loop (in-process: no need to batch)."""
        return self.processed_ref(msg_id)

    def counts(self, *, all_flows: bool = False) -> dict[str, int]:
        """Rows per table for this flow ('processed' = messages that took effect), or
        for every flow in the file with all_flows=True."""
        where, args = ("", ()) if all_flows else (" WHERE flow = ?", (self.flow,))
        out = {}
        for key, table in (
            ("processed", "messages"),
            ("duplicates", "duplicates"),
            ("failures", "failures"),
            ("replays", "replays"),
        ):
            row = self._q1(f"SELECT count(*) FROM {table}{where}", args)
            assert row is not None  # count(*) always answers one row
            out[key] = int(row[0])
        return out

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

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> tuple[list[str], list[tuple[Any, ...]]]:
        try:
            cur = self._read.execute(sql, args)
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

        SUCCESS inserts the `messages` row with ON CONFLICT DO NOTHING; no row back
        means another copy got there first, and the entry becomes a DUPLICATE (or
        `recovered`, when the row names this very copy). Then the flow's SQL effect
        runs for each entry that won its row (`onceq.ledger.sql_step`): one that fails is
        undone alone, row and all. A failure that a crashed run already recorded for
        this very copy is not recorded twice (`recovered`). A success whose values
        SQLite cannot store (`onceq.core.values`) becomes a dead letter, reason
        ledger-refused, and the rest of its group commits; a database error (I/O,
        disk, schema) is the ledger's and fails the whole group with LedgerError.
        """
        now = utcnow()
        entries = list(entries)
        for e in entries:
            if e.kind is Kind.SUCCESS:
                # Built once here, checked as it is built: one message's value that
                # SQLite cannot bind (an int over 64 bits, a lone surrogate) would fail
                # the whole group, so it is refused alone.
                problem = self._build_row(e, now)
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

    def _build_row(self, e: Entry, now: str) -> str:
        """Set e.row (its `messages` row, INSERT column order); why it cannot be stored, or ''."""
        return build_row(e, self.flow, self.source, now)

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
        won, lost = record_successes(conn, [e for e in entries if e.kind is Kind.SUCCESS])
        ledger_sql.apply(self, conn, won)
        if lost and any(w.kind is not Kind.SUCCESS for w in won):
            # A second copy in this group lost to a winner whose effect then failed:
            # it took no effect either, so it shares the verdict (never acked as done).
            failed = {w.delivery.msg_id: w for w in won if w.kind is not Kind.SUCCESS}
            for e in lost:
                if (w := failed.get(e.delivery.msg_id)) is not None:
                    ledger_sql.same_verdict(e, w)
        for e in entries:
            if e.kind is Kind.DUPLICATE:
                record_duplicate(conn, self.flow, self.source, e, now)
            elif e.kind in (Kind.REJECTED, Kind.TRANSIENT):
                if failure_recorded(conn, self.flow, self.source, e):
                    e.recovered = True
                else:
                    record_failure(conn, self.flow, self.source, e, now)
