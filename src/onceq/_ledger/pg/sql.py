"""SQLite-style SQL on PostgreSQL: `?` / `?N` placeholders become `$N`, run raw.

The ledger's shared queries (`onceq._ledger.rows`, `onceq._ledger.ops`, H5's retention)
are written once, in the SQL both databases accept, with SQLite's placeholders. On a
PostgreSQL ledger `translate` rewrites the placeholders (once per text: cached) and
`PgTx` runs the result on a `psycopg.RawCursor`, whose `$N` placeholders go to the
server as they are: no client-side `%s` parsing, and the same text for every call, so
psycopg prepares it server-side after a few runs.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

import psycopg

# A quoted literal or identifier is copied as it is (a '?' inside one is not a
# placeholder); a '?' followed by digits is a numbered placeholder.
_TOKEN = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\?(\d*)")


@functools.lru_cache(maxsize=1024)
def translate(sql: str) -> str:
    """`sql` with SQLite's placeholders as PostgreSQL's.

    SQLite numbers a bare `?` one above the largest number given so far (so
    `?1,?2,?,?` is 1, 2, 3, 4), and `?N` is N: the same rule here, so a text means the
    same parameters on both.
    """
    top = 0

    def sub(m: re.Match[str]) -> str:
        nonlocal top
        if m.group(0)[0] != "?":
            return m.group(0)
        num = int(m.group(1)) if m.group(1) else top + 1
        top = max(top, num)
        return f"${num}"

    return _TOKEN.sub(sub, sql)


class PgTx:
    """A connection as the shared queries see it: `.execute(sql, args)` with `?` SQL,
    returning a cursor (fetchone, fetchall, rowcount, description).

    `conn` is the psycopg connection itself, for what is not shared (the SQL effect's
    function gets it, nested transactions are its savepoints).
    """

    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def execute(self, sql: str, args: Sequence[Any] | None = None) -> psycopg.RawCursor[Any]:
        cur = psycopg.RawCursor(self.conn)
        cur.execute(translate(sql), args if args else None)
        return cur

    @property
    def in_transaction(self) -> bool:
        return self.conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
