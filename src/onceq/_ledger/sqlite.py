"""The idempotency ledger: SQLite, one row per (flow, message id) that took effect.

The primary key of `messages` is what makes consumption effectively once: the
second copy of a message finds its row and is refused by the database, not by an
`if` that two processes could both pass. Everything else recorded about a message
(a duplicate sighting, a failure and what was done about it, a flow's SQL effect)
is written in the same transaction as that row, and the transport settles (moves
the file, acks the delivery) only after the transaction is durable.

Every read and write is scoped to the ledger's flow: two flows in one file never
refuse each other's ids. Only the consume loop writes here, plus the replays and
dead-letter operations a human runs (`onceq._ledger.ops`: attempts, dead letters,
replays and their audit).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from onceq._core.effect import SqlEffect
from onceq._core.entry import Entry
from onceq._ledger.db import connect, connect_or_create, deny_attach
from onceq._ledger.file_guard import FileGuard, file_guard
from onceq._ledger.ops import LedgerOps, utcnow
from onceq._ledger.rows import _encode_kept, build_row, encode_kept
from onceq._ledger.sqlite_commit import SqliteCommit
from onceq.errors import LedgerError, UsageError

# Names this module has always offered (the tests', the other ledger's): kept here.
__all__ = [
    "DEFAULT_FLOW",
    "Entry",
    "Ledger",
    "_encode_kept",
    "build_row",
    "check_flow_name",
    "encode_kept",
    "utcnow",
]

FLOW_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
DEFAULT_FLOW = "default"


def check_flow_name(name: str) -> str:
    if not isinstance(name, str) or not FLOW_NAME.fullmatch(name):
        raise UsageError(
            f"flow {name!r}: not a flow name (letters, digits, '_', '.', '-';"
            " 1 to 64, starting with a letter or digit)"
        )
    return name


class Ledger(SqliteCommit, LedgerOps):
    """The ledger at `path`, for the flow `flow`. `source` tags rows ('dirq', 'amqp').

    `sql` is the flow's SQL effect: its `setup` runs when the ledger opens, its
    function (or bulk form) in every group commit. With create=True a missing file is
    made (never its folder: LedgerError), and `created` says so; with create=False it
    is NotFound. A 0.1.0 ledger is migrated on open (`onceq._ledger.migrate`).
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
        # The duplicate checks asked for this tick of the loop (`aprocessed_ref`).
        self._asked: list[tuple[str, asyncio.Future[str | None]]] | None = None
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

    # --- the consume loop's side (onceq._core.ledger_api.LedgerApi) --------------------

    def ping(self) -> bool:
        """An SQLite file is never away (it has no connection to lose)."""
        return True

    def interrupt(self) -> None:
        """Nothing to interrupt: a commit never waits for a lost database."""

    def inflight_guard(self) -> FileGuard:
        """A byte-range lock per msg_id on `<ledger>-inflight` (onceq._core.inflight)."""
        return file_guard(self.path, self.flow)

    def storage_size(self) -> dict[str, int]:
        """The database file and its write-ahead log (-wal): what the ledger takes on disk."""
        out = {}
        for part, suffix in (("file", ""), ("wal", "-wal")):
            try:
                out[part] = os.stat(f"{self.path}{suffix}").st_size
            except FileNotFoundError:
                out[part] = 0
        return out

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
        """`processed_ref` for the event loop: the ids asked for in one tick of the loop
        are read together, in one query, at the end of that tick.

        In-process, but not free: every read transaction takes the WAL's read locks
        (fcntl), and the first read after each group commit finds the reader's page
        cache reset and reads its pages again (~50 us, against ~4 us for a read with
        no commit since). One read per tick pays that once for every delivery the tick
        started (3 to 4 at prefetch 50 on a fast partner), as PostgreSQL's round trip
        is paid once (onceq._ledger.pg.precheck). Read at once per message instead
        (`processed_ref`), the loop ran ~4% fewer instructions but used ~9% more CPU
        (BENCHMARKS.md): each read is a sqlite3 step that gives up the GIL, and the
        commit's thread takes it in between. On the loop, not in a thread: the read answers in
        microseconds, a thread hand-off costs more. The answer is never kept past its
        tick: a twin elsewhere may commit the id at any moment.
        """
        loop = asyncio.get_running_loop()
        waiting = self._asked
        if waiting is None:
            waiting = self._asked = []
            # After every callback already due this tick: the other deliveries being
            # started now add their ids first.
            loop.call_soon(self._answer_asked)
        fut: asyncio.Future[str | None] = loop.create_future()
        waiting.append((msg_id, fut))
        return await fut

    def _answer_asked(self) -> None:
        asked, self._asked = self._asked or [], None
        try:
            found = (
                self.processed_refs(list(dict.fromkeys(m for m, _ in asked)))
                if len(asked) > 1
                else {m: r for m in (asked[0][0],) if (r := self.processed_ref(m)) is not None}
            )
        except Exception as exc:  # every waiter gets the ledger's error
            for _, fut in asked:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for msg_id, fut in asked:
            if not fut.done():  # a waiter cancelled meanwhile takes nothing
                fut.set_result(found.get(msg_id))

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
            row: tuple[Any, ...] | None = self._read.execute(sql, args).fetchone()
            return row
        except sqlite3.Error as exc:
            raise LedgerError(f"{self.path}: read failed: {exc}") from exc

    # --- writes ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        conn = self._write
        try:
            # IMMEDIATE takes the write lock up front: two consumers queue here (busy
            # timeout) instead of deadlocking on a read lock upgraded to a write.
            # Not through execute(): its statement cache would keep a BEGIN, COMMIT or
            # ROLLBACK that a SQL effect's function could reuse past the guard
            # (`onceq._ledger.sqlite_commit._TxGuard`). No transaction is open here, so
            # executescript has none to commit first.
            conn.executescript("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise LedgerError(f"{self.path}: cannot begin a transaction: {exc}") from exc
        try:
            yield conn
            conn.commit()
        except BaseException as exc:
            if conn.in_transaction:
                conn.rollback()
            if isinstance(exc, sqlite3.Error):
                raise LedgerError(f"{self.path}: write failed: {exc}") from exc
            raise
