"""A read-only session on a ledger, SQLite or PostgreSQL: what `status`, `trace` and
the console read through.

The people who look (an operator, a dashboard) should not be able to change anything,
and a look must never create a ledger in front of a queue, so:

- SQLite: a `mode=ro` URI. The file is never created, never migrated, never switched
  to WAL; readers in WAL mode do not block the consumer's commits.
- PostgreSQL: a read-only session (`default_transaction_read_only`), every read in one
  transaction.

Either way every read of one session sees one snapshot (processed and dead letters add
up at one instant). The SQL is written once with `?` placeholders
(`onceq._ledger.pg.sql.translate` for PostgreSQL), as the ledgers' shared queries are.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from onceq._ledger.target import describe, is_pg_url
from onceq.errors import LedgerError

Rows = Callable[..., list[tuple[Any, ...]]]  # rows(sql, args=()) -> the rows


@dataclass(frozen=True)
class Reading:
    """An open read-only session: `rows(sql, args)` and the ledger's table names."""

    rows: Rows
    tables: frozenset[str]
    where: str  # the ledger as errors name it (a path, a URL without its password)


class NoLedger(LedgerError):
    """Nothing to read there yet: no file, no onceq schema, or no `messages` table."""


@contextlib.contextmanager
def read_only(target: str | Path) -> Iterator[Reading]:
    """A read-only snapshot of the ledger at `target`. NoLedger (one line) when there is
    no ledger there; LedgerError / LedgerUnavailable when it cannot be read."""
    where = describe(target)
    if is_pg_url(target):
        # why: psycopg loads only for a PostgreSQL ledger (start-up of an SQLite read)
        from onceq._ops.pg_sessions import read_session

        with read_session(str(target), where) as s:
            if s is None:
                raise NoLedger("no onceq ledger in this database yet (not created)")
            yield _checked(Reading(s[0], frozenset(s[1]), where))
        return
    path = Path(target)
    if not path.exists():
        raise NoLedger(f"no ledger at {path} yet (not created)")
    with _sqlite_session(path) as (rows, tables):
        yield _checked(Reading(rows, frozenset(tables), where))


def _checked(reading: Reading) -> Reading:
    if "messages" not in reading.tables:
        raise NoLedger("not an onceq ledger yet (no table messages)")
    return reading


@contextlib.contextmanager
def _sqlite_session(path: Path) -> Iterator[tuple[Rows, set[str]]]:
    # mode=ro: SQLite refuses every write on this connection, and never makes the file.
    uri = f"file:{quote(str(path.resolve()))}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=10)
    except sqlite3.Error as exc:
        raise LedgerError(f"{path}: cannot read the ledger: {exc}") from None
    try:
        # One read transaction: every read from the same snapshot.
        conn.execute("BEGIN")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}

        def rows(sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
            return conn.execute(sql, args).fetchall()

        yield rows, tables
    except sqlite3.Error as exc:
        raise LedgerError(f"{path}: cannot read the ledger: {exc}") from None
    finally:
        with contextlib.suppress(sqlite3.Error):
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        conn.close()
