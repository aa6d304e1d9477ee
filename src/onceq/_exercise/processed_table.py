"""The exercises' `processed` table, as a built-in SQL effect of the presets.

Since schema 2 the ledger's dedup row lives in `messages`, per flow. The exercises
still read `processed` (seed 000: `.schema processed`, order-check.sql, the row
counts), so the presets (orders, claims) write it as their *business* table, in the
ledger's own transaction: its row and the dedup row commit together or not at all,
exactly like a user's SQL effect. The DDL is 0.1.0's, word for word, so
`.schema processed` prints what it always printed.

It is a bulk effect: a few multi-row INSERTs per group (`onceq._ledger.rows.chunks`:
powers of two, so each statement text is prepared once per run), so the presets pay
a handful of statements per group for it, not one per message. Its columns come from the
decoder's fields: order_no = the group, seq, amount = kept["amount"].
"""

from __future__ import annotations

import functools
import sqlite3
from typing import TYPE_CHECKING, Any

from onceq._core.effect import SqlEffect
from onceq._ledger.rows import chunks

if TYPE_CHECKING:
    # why: psycopg loads only for a PostgreSQL ledger (start-up of an SQLite run)
    from onceq._ledger.pg.sql import PgTx
    from onceq._ledger.sqlite import Entry

DDL = """
CREATE TABLE IF NOT EXISTS processed (
    msg_id       TEXT PRIMARY KEY,
    order_no     TEXT,              -- the business key: an order number, a claimId
    seq          INTEGER,           -- the sender's sequence number within order_no
    amount       REAL,
    processed_at TEXT NOT NULL,     -- UTC, ISO 8601
    source       TEXT NOT NULL DEFAULT 'dirq',
    ref          TEXT               -- the file name / delivery that took effect
);
"""


# The same table on a PostgreSQL ledger (created in schema onceq: the ledger's
# search_path): SQLite's INTEGER and REAL as PostgreSQL's 64-bit and double types.
DDL_POSTGRESQL = """
CREATE TABLE IF NOT EXISTS processed (
    msg_id       TEXT PRIMARY KEY,
    order_no     TEXT,
    seq          BIGINT,
    amount       DOUBLE PRECISION,
    processed_at TEXT NOT NULL,
    source       TEXT NOT NULL DEFAULT 'dirq',
    ref          TEXT
);
"""


def write_rows(tx: sqlite3.Connection | PgTx, entries: list[Entry]) -> None:
    """One INSERT per chunk of the entries that took effect (their dedup rows are in).

    The chunks are `onceq._ledger.rows.chunks`: the won entries of a group number
    anything (its size minus its duplicates), and a row count not seen before is a
    statement text to parse and plan again.

    A plain INSERT, not ON CONFLICT DO NOTHING: a msg_id already here but not in
    `messages` is an inconsistency a person made, and the ledger refuses that one
    message (ledger-refused) instead of letting the two tables disagree silently.
    """
    if not isinstance(tx, sqlite3.Connection):
        # Only a PostgreSQL ledger's transaction is anything else. Asked this way
        # round so that an SQLite run never imports psycopg: that import (~0.1 s)
        # landed in the first group commit, inside a run's measured time.
        from onceq._ledger.pg.sql import PgTx

        assert isinstance(tx, PgTx)
        _write_rows_pg(tx, entries)
        return
    for chunk in chunks(entries):
        # e.row: (flow, msg_id, grp, seq, kept, partner_duplicate, at, source, ref);
        # processed_at and source are the group's, bound once (`_insert_many`).
        r = chunk[0].row
        args: list[Any] = [r[6], r[7]]
        for e in chunk:
            r = e.row
            args += (r[1], r[2], r[3], (e.fields.get("kept") or {}).get("amount"), r[8])
        tx.execute(_insert_many(len(chunk)), args)


@functools.cache
def _insert_many(rows: int) -> str:
    """The insert of `rows` rows: one text per size, prepared once (`chunks`);
    processed_at and source bound once as ?1 and ?2, as in `ledger_rows._insert_many`."""
    row = "(?1,?2,?,?,?,?,?)"
    return (
        "INSERT INTO processed (processed_at, source, msg_id, order_no, seq, amount, ref)"
        " VALUES " + ",".join([row] * rows)
    )


# On PostgreSQL one statement per group whatever its size (the messages insert's form,
# `onceq._ledger.pg.rows`): the rows as one JSON text (`onceq._ledger.pg.sql.batch`),
# one prepared text. The amount goes as its repr, a string: JSON has no NaN or
# infinity, PostgreSQL's float8 reads them, and a repr reads back as the same double.
_INSERT_PG = (
    "INSERT INTO processed (processed_at, source, msg_id, order_no, seq, amount, ref)"
    " SELECT %b::text, %b::text, r->>0, r->>1, (r->>2)::bigint, (r->>3)::float8, r->>4"
    " FROM jsonb_array_elements(%b::text::jsonb) AS r"
)


def _number(amount: Any) -> str:
    try:
        return repr(float(amount))
    except (TypeError, ValueError, OverflowError):
        import psycopg

        # A DataError: the message's row fault (ledger-refused), never the group's.
        raise psycopg.DataError(f"amount {amount!r}: not a number") from None


def _write_rows_pg(tx: PgTx, entries: list[Entry]) -> None:
    if not entries:
        return
    rows: list[tuple[Any, ...]] = []
    for e in entries:
        row = e.row
        amount = (e.fields.get("kept") or {}).get("amount")
        # float8: SQLite's REAL column takes what it is given; here a non-number
        # amount refuses its message (ledger-refused), as a bad value does.
        rows.append((row[1], row[2], row[3], None if amount is None else _number(amount), row[8]))
    first = entries[0].row
    tx.conn.cursor().execute(_INSERT_PG, (first[6], first[7], tx.batch(rows)))


PROCESSED_TABLE = SqlEffect(
    function=None, setup=DDL, bulk=write_rows, setup_postgresql=DDL_POSTGRESQL
)
