"""What the PostgreSQL ledger does when its connection is lost.

Reads run on the event loop: they must never wait for the database to come back, so
a lost connection is LedgerUnavailable at once, and the next read makes at most one
quick, rate-limited attempt to reconnect (the loop holds its copies and polls
`ping()` meanwhile).

A group commit runs in a worker thread and holds copies that are not yet settled: it
waits the outage out, reconnecting with backoff (0.2 s doubling to 5 s), and writes
the SAME group with the SAME `now` again. The dangerous case is a COMMIT sent whose
answer was lost: it may have been applied. Each group's transaction notes its
transaction id first (`pg_current_xact_id()`); after reconnecting, `pg_xact_status`
says whether it committed (the group is done: the entries keep the verdicts of that
try, nothing is written twice), aborted (write it again), or is still in progress
(a backend the server has not yet noticed is gone: wait). `interrupt()` (Consumer.stop)
makes the wait give up with LedgerError.

One WARNING line when the connection is lost, one when it is back; the URL in them is
redacted (`PgLedger.path`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import psycopg

from onceq._ledger.pg import schema
from onceq._ledger.pg.ahead import Ahead
from onceq._ledger.pg.pipeline import pipeline
from onceq.errors import LedgerError, LedgerUnavailable

if TYPE_CHECKING:
    from onceq._ledger.pg.commit import PgCommit

log = logging.getLogger("onceq.ledger")

BACKOFF_FIRST, BACKOFF_MAX = 0.2, 5.0
# A read's reconnect: libpq's shortest connect timeout (it rounds 1 up to 2 s), and at
# most one attempt per second, so a loop polling ping() is not slowed by each try.
READ_CONNECT_TIMEOUT = 2
READ_RETRY_EVERY = 1.0
# A deadlock or serialization failure between two consumers' groups is retried at once
# (the other group has gone through); this many times before it is the ledger's error.
ROLLBACK_RETRIES = 20
# After a try that did not wait for its insert's answer failed (a copy already
# recorded), this many groups wait for it: a burst of redeliveries costs one extra
# try, not one per group.
CALM_GROUPS = 16
# The id of the transaction a COMMIT AND CHAIN began (`Reconnector._end`).
NEXT_XID = "SELECT pg_current_xact_id()::text"


def is_connection_error(exc: BaseException, conn: psycopg.Connection[Any] | None = None) -> bool:
    """Is `exc` the connection's loss (server gone, session terminated), not a refusal?"""
    if conn is not None and (conn.closed or conn.broken):
        return isinstance(exc, psycopg.Error)
    if isinstance(exc, psycopg.InterfaceError):
        return True
    state = getattr(exc, "sqlstate", None) or ""
    # 08: connection exception (but 08P01, a protocol violation, is a bug of ours);
    # 57P01-03: admin shutdown, crash shutdown, cannot connect now. No sqlstate and no
    # connection to ask: the client's own "server closed the connection". (With the
    # connection at hand, a bare OperationalError on a healthy one, e.g. raised by an
    # SQL effect's function, is not a loss: waiting for a reconnect would never end.)
    return isinstance(exc, psycopg.OperationalError) and (
        (state.startswith("08") and state != "08P01")
        or state in ("57P01", "57P02", "57P03")
        or (not state and conn is None)
    )


class _StillRunning(Exception):
    """The lost COMMIT's transaction is still in progress on the server."""


class Reconnector:
    """The connection-loss state of one PgLedger (`where` is its redacted URL)."""

    def __init__(self, where: str, lock: threading.RLock) -> None:
        self.where = where
        self._interrupted = threading.Event()
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._last_try = 0.0
        self.xid: str | None = None  # the current group transaction's id, once known
        self.pid: int | None = None  # and its session's server process
        self._begun = False  # the current group's BEGIN went out (`begun`, `begin`)
        self._tail: contextlib.ExitStack | None = None  # its open pipeline to the COMMIT
        # The next transaction, begun with this one's COMMIT (`onceq._ledger.pg.ahead`).
        self.ahead = Ahead(lock)
        self.want_ahead = False  # begin the next one with this COMMIT (`PgCommit`)
        self.pre_begun = False  # this transaction was begun ahead: its id was in hand first
        # This try's dedup insert went out without waiting for its answer
        # (`PgCommit._insert_rows`): any failure of the try is then tried again the
        # usual way (`run_commit`), never taken for a row's fault.
        self.optimistic = False
        self.calm = 0  # groups left that wait for their insert's answer (CALM_GROUPS)

    # --- the two log lines ---------------------------------------------------------

    def went_down(self, exc: BaseException) -> None:
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since = time.monotonic()
        log.warning(
            "ledger %s: connection lost (%s); reconnecting",
            self.where,
            schema._why(exc),
            extra={"event": "ledger-lost"},
        )

    def _came_back(self) -> None:
        with self._lock:
            since, self._down_since = self._down_since, None
        if since is not None:
            log.warning(
                "ledger %s: reconnected after %.1f s",
                self.where,
                time.monotonic() - since,
                extra={"event": "ledger-back"},
            )

    def lost(self, exc: BaseException) -> LedgerUnavailable:
        """A read's lost connection, as the error to raise."""
        self.went_down(exc)
        return LedgerUnavailable(
            f"{self.where}: the ledger's database is unavailable: {schema._why(exc)}"
        )

    def interrupt(self) -> None:
        self._interrupted.set()

    # --- reads: one quick attempt -----------------------------------------------------

    def reconnect_now(self, url: str, old: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
        """A new session for a read, or LedgerUnavailable at once (never a wait)."""
        with contextlib.suppress(Exception):
            old.close()
        now = time.monotonic()
        if now - self._last_try < READ_RETRY_EVERY:
            raise LedgerUnavailable(f"{self.where}: the ledger's database is unavailable")
        self._last_try = now
        try:
            conn = schema.connect(url, self.where, connect_timeout=READ_CONNECT_TIMEOUT)
        except LedgerUnavailable as exc:
            self.went_down(exc)
            raise
        self._came_back()
        return conn

    # --- commits: wait it out ---------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        """A group's transaction: COMMITted when the block ends, rolled back when it raises.

        Two round trips and four statements for a group in the common case, where
        psycopg's plain calls took four round trips (BEGIN with the id, the dedup
        insert, the SQL effect's insert, COMMIT), each of which is time the group holds
        its rows' locks, CPU of the loop's process (the GIL) and a wake-up of the server
        on a shared machine:

        - the BEGIN is not sent here but with the group's first statement (`begun`),
          the dedup insert, which returns the transaction id too
          (`pg_current_xact_id()`, `onceq._ledger.pg.rows`): one pipeline, its answers
          asked for with a Flush, one round trip;
        - that pipeline stays open: the statements that need no answer before the
          COMMIT (the presets' bulk insert, the duplicates' rows) are queued and go
          out with the COMMIT and the pipeline's one Sync (`tail`). What needs the
          transaction's state at hand first (a savepoint, the SQL effect's functions)
          ends the pipeline before it (`sync`: one round trip more, as before).

        With `want_ahead` the COMMIT is a COMMIT AND CHAIN, which begins the next
        transaction, and that one's id is asked for behind it (`_end`,
        `onceq._ledger.pg.ahead`): the next group then starts with its id in
        hand (`pre_begun`) and can go out whole, its insert not waited for (one round
        trip; `optimistic`, a failure of which is tried again the usual way).

        The COMMIT is never sent before the transaction id is back: a COMMIT whose
        answer is lost is looked up by that id (`run_commit`), so the id must be in
        hand before the COMMIT can be in doubt. (One round trip for the whole group
        would send them together; a connection lost then could leave a COMMIT applied
        and no id to ask about.) The BEGIN is explicit, never the pipeline's implicit
        transaction: a Sync that psycopg sends on its own (a nested pipeline) then ends
        no transaction. A statement that fails in a pipeline makes the server skip the
        rest up to the Sync, the COMMIT with them: the error is raised when its answer
        is read (at the Flush or the Sync) and the transaction rolled back, as when
        each statement was sent alone. Nested conn.transaction() blocks inside are
        savepoints once `begin` has run.
        """
        self.xid = self.ahead.take(conn)  # begun ahead with the last COMMIT, or None
        self._begun = self.pre_begun = self.xid is not None
        self.optimistic = False
        self.pid = conn.info.backend_pid
        self._tail = None
        try:
            yield
            self.begin(conn)  # nothing was written: still one id to look up if in doubt
            if self.want_ahead:
                # The next transaction begins as this one commits (AND CHAIN: one
                # statement for COMMIT and BEGIN), its id asked for in the same Sync.
                self.tail(conn)
                done = conn.execute("COMMIT AND CHAIN")
            else:
                done = conn.execute("COMMIT")  # with a tail: queued behind its statements
            if self._tail is not None:
                # Still the transaction's while `_end` runs: psycopg raises an error
                # already back (the insert not waited for) at ANY statement queued in
                # the pipeline, the id's behind the COMMIT too, and then the pipeline
                # must still be ended below before the ROLLBACK.
                self._end(conn, self._tail, done)
                self._tail = None
        except BaseException:
            tail, self._tail = self._tail, None
            if tail is not None:
                # Leaves pipeline mode (psycopg syncs, and only logs an error of its own
                # here: the one being raised is the group's).
                with contextlib.suppress(psycopg.Error):
                    tail.__exit__(*sys.exc_info())
            if not (conn.closed or conn.broken) and (
                conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
            ):
                with contextlib.suppress(psycopg.Error):
                    conn.execute("ROLLBACK")
            raise

    def _end(
        self, conn: psycopg.Connection[Any], tail: contextlib.ExitStack, done: psycopg.Cursor[Any]
    ) -> None:
        """The tail's Sync (one round trip; a failed statement raises here), with the
        id of the next transaction (chained to the COMMIT) asked for when `want_ahead`."""
        if not self.want_ahead:
            tail.close()
            return
        nxt = conn.execute(NEXT_XID)
        try:
            tail.close()
        except psycopg.Error:
            if conn.closed or conn.broken or done.statusmessage != "COMMIT":
                raise  # the group's own failure, or a COMMIT in doubt: looked up
            # The group committed; only the next transaction's start failed: the next
            # group begins as usual.
            if conn.info.transaction_status is not psycopg.pq.TransactionStatus.IDLE:
                with contextlib.suppress(psycopg.Error):
                    conn.execute("ROLLBACK")
            return
        row = nxt.fetchone()
        if row is not None:
            self.ahead.note(conn, row[0])

    @contextlib.contextmanager
    def begun(self, conn: psycopg.Connection[Any], *, keep: bool) -> Iterator[bool]:
        """The statement sent in the block goes out with the transaction's BEGIN (when
        it is not sent yet): one pipeline, one round trip. True when it did: the
        statement must then return the transaction's id, which the caller reads and
        gives to `note_xid` before anything else. With `keep` the pipeline stays open
        to the COMMIT (`tail`; the answers are asked for with a Flush), else it ends
        with the block (a Sync)."""
        if self._begun:
            yield False
            return
        stack = contextlib.ExitStack()
        stack.enter_context(pipeline(conn))
        self._begun = True
        if keep:
            self._tail = stack
            conn.execute("BEGIN")
            yield True
            return
        with stack:
            conn.execute("BEGIN")
            yield True

    def begin(self, conn: psycopg.Connection[Any]) -> None:
        """Send the transaction's BEGIN now (one round trip) unless it went already."""
        if not self._begun:
            with pipeline(conn):
                self._begun = True
                conn.execute("BEGIN")
                cur = conn.execute("SELECT pg_current_xact_id()::text")
            row = cur.fetchone()
            self.note_xid(row[0] if row else None)

    def note_xid(self, xid: str | None) -> None:
        """The transaction's id, back from the server: from now on a lost COMMIT is
        looked up by it."""
        self.xid = xid

    def tail(self, conn: psycopg.Connection[Any]) -> None:
        """From here to the COMMIT, statements are queued and go out with it (one round
        trip); an answer asked for before (a fetch) is a flush of what is queued."""
        if self._tail is None and self._begun:
            stack = contextlib.ExitStack()
            stack.enter_context(pipeline(conn))
            self._tail = stack

    def sync(self) -> None:
        """End the open pipeline, if any (its Sync: one round trip; a failed statement
        in it raises here): what follows runs one statement at a time, with the
        transaction's state at hand (psycopg's savepoints need it)."""
        tail, self._tail = self._tail, None
        if tail is not None:
            tail.close()

    def run_commit(
        self, ledger: PgCommit, attempt: Callable[[psycopg.Connection[Any]], None]
    ) -> None:
        """Run `attempt(conn)` until it goes through, reconnecting as needed."""
        delay = BACKOFF_FIRST
        rollbacks = 0
        in_doubt: str | None = None
        old_pid: int | None = None
        while True:
            if self._interrupted.is_set() and self._down_since is not None:
                raise LedgerError(f"{self.where}: stopped while waiting for the ledger's database")
            conn = ledger._write
            try:
                if conn.closed or conn.broken:
                    with contextlib.suppress(Exception):
                        conn.close()
                    conn = ledger._write = schema.connect(ledger.url, self.where)
                if in_doubt is not None:
                    status = self._status(conn, in_doubt)
                    if status == "committed":
                        self._came_back()
                        return  # the lost COMMIT went through: the entries hold its verdicts
                    if status == "in progress":
                        # Our old session, still alive on the server (a cut network it
                        # has not noticed): ended, so its verdict becomes final instead
                        # of its locks holding this group for the server's TCP timeout.
                        if old_pid is not None:
                            conn.execute("SELECT pg_terminate_backend(%s)", (old_pid,))
                            old_pid = None
                        raise _StillRunning
                    if status is None:
                        # Too old for the server to remember: nothing here can tell.
                        # Stop with the group unsettled: its copies come back and the
                        # ledger's rows recognise what was done (recovered, duplicate).
                        raise LedgerError(
                            f"{self.where}: cannot tell whether a commit lost with the"
                            " connection went through; stopping with its messages unsettled"
                        )
                    in_doubt = None
                try:
                    attempt(conn)
                except Exception as exc:
                    if not self.optimistic or is_connection_error(exc, conn):
                        raise
                    # The try that did not wait for its insert's answer failed (a copy
                    # already recorded, a refused row, a deadlock): rolled back whole,
                    # it is tried again the usual way, which tells them apart.
                    self.optimistic = False
                    self.xid = None
                    self.calm = CALM_GROUPS
                    continue
                self._came_back()
                return
            except psycopg.errors.TransactionRollback as exc:
                # A deadlock / serialization failure with another consumer's group:
                # nothing was written; the same group again.
                rollbacks += 1
                if rollbacks > ROLLBACK_RETRIES:
                    raise LedgerError(f"{self.where}: write failed: {schema._why(exc)}") from None
                continue
            except (psycopg.Error, LedgerUnavailable, _StillRunning) as exc:
                if not (
                    isinstance(exc, LedgerUnavailable | _StillRunning)
                    or is_connection_error(exc, conn)
                ):
                    raise LedgerError(f"{self.where}: write failed: {schema._why(exc)}") from None
                if isinstance(exc, psycopg.Error) and self.xid is not None:
                    in_doubt = self.xid  # the COMMIT may have been applied: ask, later
                    old_pid = self.pid
                self.xid = None
                if not isinstance(exc, _StillRunning):
                    self.went_down(exc)
            if self._interrupted.wait(delay):
                raise LedgerError(f"{self.where}: stopped while waiting for the ledger's database")
            delay = min(delay * 2, BACKOFF_MAX)

    def _status(self, conn: psycopg.Connection[Any], xid: str) -> str | None:
        row = conn.execute("SELECT pg_xact_status(%s::xid8)", (xid,)).fetchone()
        return row[0] if row else None
