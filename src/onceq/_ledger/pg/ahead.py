"""The next group's transaction, begun ahead: its BEGIN and its id ride with a COMMIT.

A group commit may send its COMMIT only once the transaction's id is in the client's
hand (`onceq._ledger.pg.reconnect`: a COMMIT whose answer is lost is looked up by that
id). Begun with the group, the id costs the group a round trip of its own before the
COMMIT can go. So the writer begins the NEXT transaction with this group's COMMIT
(`COMMIT AND CHAIN`, then `pg_current_xact_id()`, one Sync): the next group starts
with its id already known and goes out whole, insert to COMMIT, in one round trip
(`onceq._ledger.pg.commit`).

What an open transaction costs while it waits, and why it never waits long:
- it holds a transaction id, so VACUUM keeps row versions newer than it, and the
  session shows `idle in transaction` (a server's `idle_in_transaction_session_timeout`
  would end it). It writes nothing and takes no row lock, no snapshot (READ
  COMMITTED takes one per statement);
- so it is rolled back once it has waited IDLE_S for a group (a thread of the
  ledger's, `Ahead`, looks every IDLE_S: at most about twice that in all),
  before every operator's write on the writer (`PgLedger._transaction`: it must not
  become a savepoint of this one) and when the ledger closes (the session goes, the
  server rolls it back). A consumer that keeps committing keeps one open at a time,
  for the gap between two groups.

Its id is never in doubt: no COMMIT of it goes out before a group was written in it.
When its session is lost while it waits, the group's try fails as any lost try
does, and its id (aborted, or in progress until the server notices) says so.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

# The longest a transaction begun ahead waits for a group before it is rolled back.
IDLE_S = 0.1


class Ahead:
    """The transaction begun ahead on the writer (`xid`, on `conn`), if any.

    Every method is called with the ledger's writer lock held (`lock`), except the
    reaper's own thread, which takes it (without waiting: a commit in progress will
    use or replace the transaction anyway)."""

    def __init__(self, lock: threading.RLock) -> None:
        self.lock = lock
        self.xid: str | None = None
        self.conn: psycopg.Connection[Any] | None = None
        self.at = 0.0  # when it was begun (time.monotonic)
        self._waiting = threading.Event()  # set while one is open: the reaper watches it
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self.rolled_back = 0  # by the reaper, for tests

    def note(self, conn: psycopg.Connection[Any], xid: str) -> None:
        """A transaction `xid` is open on `conn`, begun ahead for the next group."""
        self.xid, self.conn, self.at = xid, conn, time.monotonic()
        if not self._waiting.is_set():
            self._waiting.set()
        if self._thread is None and not self._closed.is_set():
            self._thread = threading.Thread(target=self._reap, name="onceq-pg-ahead", daemon=True)
            self._thread.start()

    def take(self, conn: psycopg.Connection[Any]) -> str | None:
        """The id of the transaction begun ahead on `conn`, now the group's; None when
        there is none on this connection (a reconnected writer)."""
        xid, mine = self.xid, self.conn
        self.xid = self.conn = None
        if xid is None or mine is not conn or conn.closed:
            return None
        if conn.info.transaction_status is not TransactionStatus.INTRANS:
            return None  # not what it was left in: a group begins as usual
        return xid

    def drop(self) -> None:
        """Roll the transaction begun ahead back, if any (its session stays)."""
        conn = self.conn
        self.xid = self.conn = None
        if conn is None or conn.closed or conn.broken:
            return
        if conn.info.transaction_status is not TransactionStatus.IDLE:
            # A session lost meanwhile: the next use of the writer finds it so.
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")

    def close(self) -> None:
        """Stop the reaper (the caller closes the session, which ends the transaction)."""
        self._closed.set()
        self._waiting.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _reap(self) -> None:
        while True:
            self._waiting.wait()
            if self._closed.wait(IDLE_S):
                return
            if not self.lock.acquire(blocking=False):
                continue  # a commit or an operator's write holds the writer: it decides
            try:
                if self.xid is not None and time.monotonic() - self.at >= IDLE_S:
                    self.drop()
                    self.rolled_back += 1
                if self.xid is None:
                    self._waiting.clear()
            finally:
                self.lock.release()
