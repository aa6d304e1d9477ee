"""The rows a PostgreSQL group commit writes: the group's `messages` rows in ONE statement.

The other rows (duplicate sightings, failures) are `onceq._ledger.rows`' shared SQL,
run through `onceq._ledger.pg.sql.PgTx`. What differs from SQLite is the dedup insert:

- One statement per group, whatever its size: `INSERT … SELECT … FROM
  jsonb_array_elements(rows)` binds four parameters (the rows as one JSON text:
  `onceq._ledger.pg.sql.batch` says why not arrays), so its text never changes and
  psycopg prepares it once per session. SQLite's multi-row VALUES lists need one text
  per size (`onceq._ledger.rows.chunks`); a VALUES list here would too, and would bind
  six parameters per row.
- A refused row aborts the whole PostgreSQL transaction (SQLite undoes just the
  statement), so there is no in-place row-by-row fallback: `record_success` is the
  careful path's, in a savepoint per entry (`onceq._ledger.commit`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg

from onceq._core.transport import Kind, Settle
from onceq._core.values import INT64_MAX, INT64_MIN
from onceq._ledger.pg.sql import batch
from onceq._ledger.rows import build_row

if TYPE_CHECKING:
    from onceq._core.entry import Entry

# psycopg's own placeholders, %b (binary), not a translated `?` text. Each row is a
# JSON array [msg_id, grp, seq, kept, partner_duplicate, ref] (`group_insert`); jsonb,
# not json: parsed once, where json's `->>` parses each element again per field (the
# server's CPU per row, 3.6 against 6.3 µs).
_INSERT_STRICT = (  # every row goes in, or it fails: see `strict`
    "INSERT INTO messages (processed_at, flow, source, msg_id, grp, seq, kept,"
    " partner_duplicate, ref)"
    " SELECT %b::text, %b::text, %b::text, r->>0, r->>1, (r->>2)::bigint, r->>3,"
    " (r->>4)::int, r->>5 FROM jsonb_array_elements(%b::text::jsonb) AS r"
)
_INSERT_GROUP = _INSERT_STRICT + " ON CONFLICT (flow, msg_id) DO NOTHING RETURNING msg_id, ref"

# The group's first statement also returns its transaction's id (a row whose msg_id is
# NULL, which no messages row has): a statement fewer than a SELECT of its own, in the
# round trip that must bring the id back before the COMMIT may go
# (`onceq._ledger.pg.reconnect.Reconnector.transaction`).
_WITH_XID = (
    "WITH won AS ({}) SELECT msg_id, ref FROM won UNION ALL SELECT NULL, pg_current_xact_id()::text"
)
_INSERT_GROUP_XID = _WITH_XID.format(_INSERT_GROUP)

_INSERT_ONE = (
    "INSERT INTO messages (flow, msg_id, grp, seq, kept, partner_duplicate, processed_at,"
    " source, ref) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
    " ON CONFLICT (flow, msg_id) DO NOTHING RETURNING msg_id"
)


def _msg_id(e: Entry) -> str:
    return e.row[1]


def pg_build_row(e: Entry, flow: str, source: str, now: str) -> str:
    """`onceq._ledger.sqlite.build_row`, plus what PostgreSQL's TEXT cannot hold: NUL.

    A msg_id or group with a NUL cannot be stored as it is (escaping it would make
    it another id, and dedup by the wrong key): the message is refused alone, as
    SQLite refuses a lone surrogate. The ref is escaped (`ledger_values.text`) as
    any ref is; kept is JSON, whose encoder already writes NUL as \\u0000.
    """
    why = build_row(e, flow, source, now)
    if why:
        return why
    f = e.fields
    for name, value in (("msg_id", e.delivery.msg_id), ("group", f.get("group"))):
        if value.__class__ is str and "\x00" in value:
            return f"{name}: text with a NUL character (PostgreSQL cannot store it)"
    row = e.row
    grp, seq = row[2], row[3]
    if not (grp is None or grp.__class__ is str) or not (seq is None or seq.__class__ is int):
        # SQLite's column affinities turn a number group into text and an integral seq
        # ('7', 7.0) into an integer; the arrays here are typed, so the same is done by
        # hand, and a seq that is no integer at all is refused (BIGINT cannot hold it).
        if grp is not None and grp.__class__ is not str:
            grp = str(grp)
        if seq is not None and seq.__class__ is not int:
            seq = _as_int(seq)
            if seq is None:
                return f"seq: {row[3]!r} is not an integer"
        e.row = (*row[:2], grp, seq, *row[4:])
    return ""


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return int(value)  # SQLite stores True as 1
    try:
        number = float(value) if not isinstance(value, int) else value
        if isinstance(value, str):
            value = value.strip()
            number = int(value) if value.lstrip("+-").isdigit() else float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if isinstance(number, float) and not number.is_integer():
        return None
    number = int(number)
    return number if INT64_MIN <= number <= INT64_MAX else None


def group_insert(group: list[Entry]) -> tuple[str, tuple[Any, ...]] | None:
    """The statement and arguments that insert the group's `messages` rows at once;
    None for an empty group, and for one that must go row by row (`record_one_by_one`).

    Its rows (`split_won`) are the copies that took effect; every other entry lost to
    the primary key (an earlier row, or an earlier copy in this statement: ON CONFLICT
    DO NOTHING skips a row that conflicts with one the same statement inserted) and
    becomes a DUPLICATE. Two entries with the same (msg_id, ref) could not be told
    apart in what comes back: such a group goes row by row. A refused row raises (the
    transaction is then aborted, and `PgLedger.commit` writes the group again entry by
    entry).
    """
    if not group:
        return None
    keys = {(e.row[1], e.row[8]) for e in group}
    if len(keys) < len(group):
        return None
    # In msg_id order (a stable sort: copies of one msg_id keep the group's order, the
    # first still wins): two consumers whose groups share msg_ids then take the rows'
    # locks in the same order and wait for each other instead of deadlocking.
    ordered = sorted(group, key=_msg_id)
    # e.row: (flow, msg_id, grp, seq, kept, partner_duplicate, at, source, ref)
    r0 = group[0].row
    rows = [(row[1], row[2], row[3], row[4], row[5], row[8]) for row in (e.row for e in ordered)]
    return _INSERT_GROUP, (r0[6], r0[0], r0[7], batch(rows))


def with_xid(sql: str, args: tuple[Any, ...]) -> tuple[str, tuple[Any, ...]]:
    """`group_insert`'s statement as the transaction's first: it returns the id too."""
    assert sql is _INSERT_GROUP
    return _INSERT_GROUP_XID, args


def strict(sql: str, args: tuple[Any, ...]) -> tuple[str, tuple[Any, ...]]:
    """`group_insert`'s statement without ON CONFLICT and with nothing to return: all
    its rows go in, or it fails (a copy already recorded is a unique violation). The
    statement of a group whose answer is not waited for
    (`onceq._ledger.pg.commit.PgCommit._insert_rows`)."""
    assert sql is _INSERT_GROUP
    return _INSERT_STRICT, args


def take_xid(rows: list[Any]) -> str | None:
    """The transaction id among the rows of `with_xid`'s statement (taken out)."""
    for i, row in enumerate(rows):
        if row[0] is None:
            return str(rows.pop(i)[1])
    return None


def split_won(group: list[Entry], rows: list[Any]) -> tuple[list[Entry], list[Entry]]:
    """(won, lost) of a group from the (msg_id, ref) rows its insert returned; every
    lost entry becomes a DUPLICATE."""
    back = set(rows)
    won: list[Entry] = []
    lost: list[Entry] = []
    for e in group:
        row = e.row
        if (row[1], row[8]) in back:
            won.append(e)
        else:  # the primary key refused a second copy
            e.kind, e.settle = Kind.DUPLICATE, Settle.ACK
            lost.append(e)
    return won, lost


def record_one_by_one(
    conn: psycopg.Connection[Any], group: list[Entry]
) -> tuple[list[Entry], list[Entry]]:
    """The group's `messages` rows one statement each (`record_success`); (won, lost)."""
    won: list[Entry] = []
    lost: list[Entry] = []
    for e in group:
        record_success(conn, e, won, lost)
    return won, lost


def record_success(
    conn: psycopg.Connection[Any], e: Entry, won: list[Entry], lost: list[Entry]
) -> None:
    """One entry's `messages` row, in a savepoint: a constraint that refuses it (a
    CHECK, a trigger's RAISE, a DataError) refuses this message alone (ledger-refused);
    any other error is the ledger's and fails the group."""
    try:
        with conn.transaction():
            cur = psycopg.RawCursor(conn)
            cur.execute(_INSERT_ONE, e.row)
            row = cur.fetchone()
    except (psycopg.IntegrityError, psycopg.DataError) as exc:
        e.kind, e.settle = Kind.REJECTED, Settle.DEAD
        e.reason, e.detail = "ledger-refused", " ".join(str(exc).split())[:200]
        return
    if row is None:  # the primary key refused a second copy
        e.kind, e.settle = Kind.DUPLICATE, Settle.ACK
        lost.append(e)
    else:
        won.append(e)
