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
import json
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


# A batch's values (a group's rows, a claim batch's ids) go to the server as ONE
# parameter, a JSON text the statement takes apart (`jsonb_array_elements`), not as
# arrays: psycopg dumps a Python list in Python, element by element (a type found for
# it, a dumper per element), ~35,000 instructions for a 2-element array against ~2,000
# for json's C encoder; a group commit of 2 messages with its 11 arrays cost the
# client 897k instructions, with JSON 504k (callgrind; the server's CPU per row: 2.7 µs
# for arrays, 3.6 µs for jsonb, 6.3 µs for json). Written as it is (no ASCII escapes):
# a text psycopg cannot encode (a lone surrogate) fails as the same value in an array
# did; NaN is refused (no JSON has it: a float goes as its repr, a string).
_BATCH = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def batch(values: Sequence[Any]) -> str:
    """`values` (str, int, None, or lists of them) as one JSON text parameter, for a
    statement's `jsonb_array_elements(%b::text::jsonb)` or `…_elements_text(…)`."""
    return _BATCH.encode(values)


class PgTx:
    """A connection as the shared queries see it: `.execute(sql, args)` with `?` SQL,
    returning a cursor (fetchone, fetchall, rowcount, description).

    `conn` is the psycopg connection itself, for what is not shared (the SQL effect's
    function gets it, nested transactions are its savepoints).
    """

    __slots__ = ("conn",)

    # A bulk statement's rows as one parameter (`batch`): the presets' SQL effect.
    batch = staticmethod(batch)

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def execute(self, sql: str, args: Sequence[Any] | None = None) -> psycopg.RawCursor[Any]:
        cur = psycopg.RawCursor(self.conn)
        cur.execute(translate(sql), args if args else None)
        return cur

    @property
    def in_transaction(self) -> bool:
        return self.conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
