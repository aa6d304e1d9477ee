"""The PostgreSQL sessions of ops: `onceq status`'s read-only one and a heartbeat's.

Apart from the modules that use them so psycopg is loaded only for a PostgreSQL
ledger: an SQLite run, and `onceq status` on an SQLite ledger, never pay for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg

from onceq._core.redact import redact_text
from onceq._ledger.pg.schema import conninfo
from onceq._ledger.pg.sql import PgTx, translate
from onceq.errors import LedgerError, LedgerUnavailable

__all__ = ["HeartbeatSession", "read_session"]

CONNECT_TIMEOUT = 5  # s: a status view never hangs on an unreachable ledger server


class HeartbeatSession:
    """A heartbeat's own autocommit session: `.execute(sql, args)` with `?` SQL, `.close()`."""

    def __init__(self, url: str, connect_timeout: float) -> None:
        pg = psycopg.connect(conninfo(url, connect_timeout=connect_timeout), autocommit=True)
        # This session's commits only: the heartbeat is not a guarantee, and an
        # fsync-free commit keeps it off the consumer's WAL flushes. A statement
        # never waits more than a beat (a lock held by a prune, a stuck server).
        pg.execute("SET synchronous_commit = off")
        pg.execute("SET statement_timeout = '5s'")
        pg.execute("SET search_path = onceq")
        self.conn = pg

    def execute(self, sql: str, args: tuple[Any, ...]) -> None:
        PgTx(self.conn).execute(sql, args)

    def close(self) -> None:
        self.conn.close()


@contextlib.contextmanager
def read_session(url: str, where: str) -> Iterator[Any]:
    """`onceq status`'s read-only session on a PostgreSQL ledger: (rows, tables), or None
    when the ledger has no onceq schema yet."""
    try:
        conn = psycopg.connect(conninfo(url, connect_timeout=CONNECT_TIMEOUT), autocommit=False)
    except psycopg.Error as exc:
        raise LedgerUnavailable(f"{where}: cannot read the ledger: {_why(exc)}") from None
    try:
        conn.read_only = True  # every transaction of this session is READ ONLY
        with conn.transaction():
            conn.execute("SET LOCAL statement_timeout = '10s'")
            # No JIT: the counts over a million-row ledger are costed high enough to be
            # compiled, and compiling took 0.7 s of a 0.9 s status read (measured,
            # PostgreSQL 15); run plainly they take 0.2 s.
            conn.execute("SET LOCAL jit = off")
            found = conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'onceq'"
            ).fetchall()
            tables = {r[0] for r in found}
            if not tables:
                yield None
                return
            conn.execute("SET LOCAL search_path = onceq")

            def rows(sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
                cur = psycopg.RawCursor(conn)
                cur.execute(translate(sql), args if args else None)
                return cur.fetchall()

            yield rows, tables
    except psycopg.OperationalError as exc:
        raise LedgerUnavailable(f"{where}: cannot read the ledger: {_why(exc)}") from None
    except psycopg.Error as exc:
        raise LedgerError(f"{where}: cannot read the ledger: {_why(exc)}") from None
    finally:
        conn.close()


def _why(exc: BaseException) -> str:
    return redact_text(" ".join(str(exc).split())[:300]) or type(exc).__name__
