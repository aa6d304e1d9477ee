"""PgLedger: the idempotency ledger in PostgreSQL, with the SQLite ledger's contract.

Same public methods and semantics as `onceq._ledger.sqlite.Ledger` (the contract suite,
tests/contract/test_ledger_contract.py, runs against both): the primary key of
`onceq.messages` refuses the second copy of a message, and everything recorded about
a message is written in the same transaction as that row. Several consumers on
several hosts can share it.

Two sessions: the writer (group commits, from the loop's worker thread, and the
operators' replays) and a reader (the duplicate pre-check, counts, reports: from the
event loop), so a read never waits behind a group's transaction.

Connection loss (`onceq._ledger.pg.reconnect`): a read raises LedgerUnavailable at once; a
commit reconnects with backoff and finishes the same group with the same `now`,
without writing twice what a lost COMMIT may have written.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import psycopg

from onceq._core.effect import SqlEffect
from onceq._core.redact import redact_url
from onceq._ledger.ops import LedgerOps
from onceq._ledger.pg import schema
from onceq._ledger.pg.commit import PgCommit
from onceq._ledger.pg.guard import PgGuard
from onceq._ledger.pg.guard_session import LOOKUP_SQL
from onceq._ledger.pg.precheck import Precheck
from onceq._ledger.pg.reconnect import Reconnector, is_connection_error
from onceq._ledger.pg.sql import PgTx, batch, translate
from onceq._ledger.retention import TABLE_NAMES
from onceq._ledger.sqlite import DEFAULT_FLOW, check_flow_name
from onceq.errors import LedgerError, LedgerUnavailable

T = TypeVar("T")


class PgLedger(PgCommit, LedgerOps):
    """The ledger in the PostgreSQL database `url`, for the flow `flow`.

    `path` is the URL with its password masked (what every message names); `url` is
    the real one, only for opening connections. `sql` is the flow's SQL effect: its
    `setup_postgresql` (else `setup`) runs when the ledger opens. create=False and no
    onceq schema here is NotFound.
    """

    kind = "postgresql"

    def __init__(
        self,
        url: str,
        source: str = "dirq",
        *,
        flow: str = DEFAULT_FLOW,
        sql: SqlEffect | None = None,
        create: bool = True,
    ) -> None:
        self.url = url
        self.path: str = redact_url(url)  # what messages name: the password masked
        self.source = source
        self.flow = check_flow_name(flow)
        self.sql = sql
        # The writer is shared by the commit thread and the operators' writes (and the
        # reaper of a transaction begun ahead: `onceq._ledger.pg.ahead`).
        self._write_lock = threading.RLock()
        self._net = Reconnector(self.path, self._write_lock)
        self._write = schema.connect(url, self.path)
        try:
            setup = (sql.setup_postgresql or sql.setup) if sql is not None else None
            self.created = schema.ensure(self._write, self.path, create=create, setup=setup)
            self._read = schema.connect(url, self.path)
        except BaseException:
            self._write.close()
            raise
        self._precheck: Precheck | None = None
        self._read_lock = threading.Lock()

    def close(self) -> None:
        # The session's end rolls back a transaction begun ahead; its reaper stops first.
        self._net.ahead.close()
        self._write.close()
        self._read.close()

    def __enter__(self) -> PgLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PgLedger({self.path!r}, flow={self.flow!r})"

    # --- connection state -----------------------------------------------------------

    def ping(self) -> bool:
        """Does the database answer now? (The loop polls it while the ledger is away.)"""
        try:
            self._rows("SELECT 1")
        except LedgerError:
            return False
        return True

    def interrupt(self) -> None:
        """Make a commit waiting for the database give up (Consumer.stop)."""
        self._net.interrupt()

    def inflight_guard(self) -> PgGuard:
        """Advisory locks on a session of their own, the duplicate check in the claim's
        round trip (`lookup`: onceq._ledger.pg.guard)."""
        return PgGuard(self.url, self.flow, lookup=True)

    def _reader(self) -> psycopg.Connection[Any]:
        with self._read_lock:
            if self._read.closed or self._read.broken:
                # On the event loop: one quick attempt at most, rate-limited, never a wait.
                self._read = self._net.reconnect_now(self.url, self._read)
            return self._read

    def storage_size(self) -> dict[str, int]:
        """pg_total_relation_size (rows, indexes, TOAST) of each ledger table in its
        schema; business tables beside them are not the ledger's."""
        _, rows = self._rows(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class AS c"
            " JOIN pg_namespace AS n ON n.oid = c.relnamespace"
            " WHERE n.nspname = ? AND c.relkind = 'r' AND c.relname IN"
            f" ({','.join('?' * len(TABLE_NAMES))})",
            (schema.SCHEMA_NAME, *TABLE_NAMES),
        )
        return {name: int(size) for name, size in rows}

    # --- reads (this flow's) ----------------------------------------------------------

    def processed_ref(self, msg_id: str) -> str | None:
        """The ref that took effect for msg_id, '' when it has none, None when unseen."""
        if "\x00" in msg_id:
            return None  # PostgreSQL cannot hold it: such a message was never recorded
        row = self._q1(
            "SELECT ref FROM messages WHERE flow = ? AND msg_id = ?", (self.flow, msg_id)
        )
        return None if row is None else (row[0] or "")

    def processed_refs(self, msg_ids: Iterable[str]) -> dict[str, str]:
        """`processed_ref` of many msg_ids in ONE round trip: {msg_id: ref} of those
        seen (see `Ledger.processed_refs`)."""
        ids = sorted({m for m in msg_ids if isinstance(m, str) and "\x00" not in m})
        if not ids:
            return {}

        def run(conn: psycopg.Connection[Any]) -> dict[str, str]:
            cur = conn.cursor()
            # The guard's lookup, the same text: one primary-key probe per id
            # (guard_session.LOOKUP_SQL says why never a join).
            cur.execute(LOOKUP_SQL, (self.flow, batch(ids)), binary=True)
            return dict(cur.fetchall())

        return self._read_op(run)

    async def aprocessed_ref(self, msg_id: str) -> str | None:
        """`processed_ref` for the event loop: the ids asked for in one tick are looked up
        together, in one round trip, off the loop (`onceq._ledger.pg.precheck`)."""
        if self._precheck is None:
            self._precheck = Precheck(self.processed_refs)
        return await self._precheck(msg_id)

    def counts(self, *, all_flows: bool = False) -> dict[str, int]:
        """Rows per table for this flow ('processed' = messages that took effect), or
        for every flow in the database with all_flows=True."""
        where, args = ("", ()) if all_flows else (" WHERE flow = ?1", (self.flow,))
        row = self._q1(
            "SELECT "
            + ", ".join(
                f"(SELECT count(*) FROM {t}{where})"
                for t in ("messages", "duplicates", "failures", "replays")
            ),
            args,
        )
        assert row is not None
        return {
            k: int(v)
            for k, v in zip(("processed", "duplicates", "failures", "replays"), row, strict=True)
        }

    def query(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run a read-only query (order checks); returns (columns, rows).

        A READ ONLY transaction: the server refuses any write (and a function that
        writes), whatever the text says; search_path onceq, so the exercises' queries
        name `processed` / `messages` bare.
        """

        def run(conn: psycopg.Connection[Any]) -> tuple[list[str], list[tuple[Any, ...]]]:
            with conn.transaction(force_rollback=True):
                conn.execute("SET TRANSACTION READ ONLY")
                cur = psycopg.RawCursor(conn)
                # prepare=True: the extended protocol, which takes ONE statement.
                # "COMMIT; DELETE …" as a simple query would end the read-only
                # transaction and run the rest outside it (sqlite3 refuses it too).
                cur.execute(sql, prepare=True)
                if cur.description is None:
                    return [], []
                return [c.name for c in cur.description], [tuple(r) for r in cur.fetchall()]

        return self._read_op(run, "query failed")

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> tuple[list[str], list[tuple[Any, ...]]]:
        def run(conn: psycopg.Connection[Any]) -> tuple[list[str], list[tuple[Any, ...]]]:
            cur = psycopg.RawCursor(conn)
            cur.execute(translate(sql), args if args else None)
            return [c.name for c in cur.description or ()], cur.fetchall()

        return self._read_op(run)

    def _q1(self, sql: str, args: Sequence[Any]) -> tuple[Any, ...] | None:
        def run(conn: psycopg.Connection[Any]) -> tuple[Any, ...] | None:
            cur = psycopg.RawCursor(conn)
            cur.execute(translate(sql), args if args else None)
            return cur.fetchone()

        return self._read_op(run)

    def _read_op(self, run: Callable[[psycopg.Connection[Any]], T], what: str = "read failed") -> T:
        """`run(reader)`; a lost session gets ONE quick reconnect and a second try (a
        blip that is over costs nothing), else LedgerUnavailable at once: reads run
        on the event loop and must never wait for the database."""
        conn = self._reader()
        try:
            return run(conn)
        except psycopg.Error as exc:
            if not is_connection_error(exc, conn):
                raise LedgerError(f"{self.path}: {what}: {schema._why(exc)}") from None
            self._net.went_down(exc)
            lost = exc
        with self._read_lock:  # the loop and the pre-check's thread: one reconnects
            if self._read is conn:
                self._read = self._net.reconnect_now(self.url, conn)
            conn = self._read
        try:
            return run(conn)
        except psycopg.Error as exc:
            if not is_connection_error(exc, conn):
                raise LedgerError(f"{self.path}: {what}: {schema._why(exc)}") from None
            raise self._net.lost(lost) from None

    # --- writes ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[PgTx]:
        """One transaction on the writer (the operators' writes, LedgerOps). A lost
        connection is LedgerUnavailable (nothing retried: the command reports it)."""
        with self._write_lock:
            # Not inside the next group's transaction (it would be a savepoint of it,
            # durable only with that group): rolled back first.
            self._net.ahead.drop()
            if self._write.closed or self._write.broken:
                self._write = self._net.reconnect_now(self.url, self._write)
            conn = self._write
            try:
                with conn.transaction():
                    yield PgTx(conn)
            except psycopg.Error as exc:
                if is_connection_error(exc, conn):
                    raise self._net.lost(exc) from None
                raise LedgerError(f"{self.path}: write failed: {schema._why(exc)}") from exc


__all__ = ["LedgerUnavailable", "PgLedger"]
