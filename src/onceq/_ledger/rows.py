"""The rows a group commit writes: dedup rows, duplicate sightings, failures.

`build_row` builds and checks each success's `messages` row (both kinds; PostgreSQL
adds its own refusals). The group commit (`onceq._ledger.commit`) then writes, inside
its one transaction: the group's `messages` rows (on SQLite `record_successes`: one
multi-row INSERT … ON CONFLICT DO NOTHING RETURNING per chunk, what comes back took
effect), the flow's SQL effect (`onceq._ledger.sql_step`), then a `duplicates` row per
refused copy and a `failures` row per failed one (the SQL both kinds share, `Tx`),
each unless a crashed run already recorded this very copy (`recovered`).
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Iterator, Sequence
from json.encoder import encode_basestring as _json_str
from typing import Any, Protocol, TypeVar

from onceq._core.entry import Entry
from onceq._core.transport import ACK, DEAD, DELAY, DUPLICATE, REJECTED, REQUEUE
from onceq._core.values import INT64_MAX, INT64_MIN, is_utf8, text, unstorable

T = TypeVar("T")


class TxCursor(Protocol):
    """What the shared SQL reads of a cursor (sqlite3.Cursor, psycopg.RawCursor)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Tx(Protocol):
    """A connection as the SQL shared by both ledgers sees it (`?` placeholders): a
    sqlite3.Connection, or a PostgreSQL one wrapped in `onceq._ledger.pg.sql.PgTx`."""

    @property
    def in_transaction(self) -> bool: ...

    def execute(self, sql: str, args: Sequence[Any] = ..., /) -> TxCursor: ...


# Rows per multi-row INSERT at most: 6 parameters each stays far below SQLite's limit
# of 32766 bound parameters; one statement instead of one per message. A power of two
# (see `chunks`).
BULK_ROWS = 256


def chunks(items: Sequence[T], limit: int = BULK_ROWS) -> Iterator[Sequence[T]]:
    """`items` in slices whose sizes are powers of two, largest first, each <= limit.

    Why not plain slices of `limit`: a multi-row INSERT's text depends on its row
    count, and a text the connection's statement cache has not seen is parsed and
    planned again (for 256 rows, as much work as inserting them). Groups vary in size
    (what is pending when the committer wakes, minus the duplicates for the presets'
    second table), so plain slices meant a new statement almost every group; powers
    of two give at most log2(limit) + 1 texts per table, each prepared once per run.
    """
    i, n = 0, len(items)
    while i < n:
        size = min(limit, 1 << ((n - i).bit_length() - 1))
        yield items[i : i + size]
        i += size


# The stored form of `kept`: compact, UTF-8 as it is, no NaN/Infinity (not JSON, and
# SQLite's JSON functions would refuse the row).
_encode_kept = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def encode_kept(kept: dict[str, Any]) -> str:
    """`kept` as stored: exactly `_encode_kept(kept)`, twice as fast for flat ones.

    Per message, in the commit's thread: the encoder's own set-up (a C encoder made
    per call, its circular-reference dict) costs more than encoding one amount. A
    dict of str keys and finite floats, ints and strs is written here with the
    encoder's own pieces (float.__repr__, int.__repr__, encode_basestring); anything
    else (a nested value, None, a bool, NaN) goes to the encoder, which also raises.
    """
    parts = []
    for k, v in kept.items():
        cls = v.__class__
        if cls is float and v - v == 0.0:  # finite: inf - inf and nan - nan are nan
            text = float.__repr__(v)
        elif cls is int:
            text = int.__repr__(v)
        elif cls is str:
            text = _json_str(v)
        else:
            return _encode_kept(kept)
        if k.__class__ is not str:
            return _encode_kept(kept)
        parts.append(_json_str(k) + ":" + text)
    return "{" + ",".join(parts) + "}"


def build_row(e: Entry, flow: str, source: str, now: str) -> str:
    """Set e.row (its `messages` row, INSERT column order); why it cannot be stored, or ''.

    Shared by both ledgers (`onceq._ledger.pg.rows.pg_build_row` adds PostgreSQL's own refusals).
    """
    f = e.fields
    d = e.delivery
    msg_id, grp, seq = d.msg_id, f.get("group"), f.get("seq")
    # Per message, so the usual values (ASCII text, no group, a 64-bit int) pass a
    # test or two inline; anything else gets the full check and its wording.
    if not (
        (msg_id.__class__ is str and msg_id.isascii())
        and (grp is None or (grp.__class__ is str and grp.isascii()))
        and (seq is None or (seq.__class__ is int and INT64_MIN <= seq <= INT64_MAX))
    ):
        for name, value in (("msg_id", msg_id), ("group", grp), ("seq", seq)):
            why = unstorable(value)
            if why:
                return f"{name}: {why}"
    kept_values = f.get("kept")
    if kept_values:
        try:
            kept = encode_kept(kept_values)
        except (TypeError, ValueError) as exc:
            return f"kept: {exc}"
        if not (kept.isascii() or is_utf8(kept)):
            return "kept: text with a lone surrogate"
    else:
        kept = "{}"
    ref = d.ref
    if not (ref.__class__ is str and ref.isascii() and "\x00" not in ref):
        ref = text(ref)
    dup = 1 if f.get("partner_duplicate") else 0
    e.row = (flow, msg_id, grp, seq, kept, dup, now, source, ref)
    return ""


_INSERT = (
    "INSERT INTO messages (flow, msg_id, grp, seq, kept, partner_duplicate, processed_at,"
    " source, ref) VALUES "
)
_ROW = "(?,?,?,?,?,?,?,?,?)"


@functools.cache
def _insert_many(rows: int) -> str:
    """The multi-row insert of `rows` rows (one text per size: `chunks`).

    processed_at, flow and source are the same for the whole group: bound once as
    ?1, ?2, ?3 and named by every row, so each row binds only its 6 own values, not
    9 (binding is per value, in the thread that holds the GIL against the loop).
    They come first in every row, and the row's own values are plain `?` (numbered
    on from 4): SQLite looks a numbered parameter up in a list of the numbered ones,
    so numbering every row's values would make preparing a 256-row statement
    quadratic; three numbered ones keep that list short.
    """
    row = "(?1,?2,?3,?,?,?,?,?,?)"
    return (
        "INSERT INTO messages (processed_at, flow, source, msg_id, grp, seq, kept,"
        f" partner_duplicate, ref) VALUES {','.join([row] * rows)}"
        " ON CONFLICT(flow, msg_id) DO NOTHING RETURNING msg_id, ref"
    )


def record_successes(conn: Tx, group: list[Entry]) -> tuple[list[Entry], list[Entry]]:
    """Insert the `messages` rows of a group, many per statement; (won, lost).

    One multi-row INSERT … ON CONFLICT DO NOTHING RETURNING per chunk: the rows
    it returns are the copies that took effect; every other entry lost to the
    primary key (an earlier row, or an earlier copy in the same statement) and
    becomes a DUPLICATE. A chunk in which the database refuses a row, or in which
    two entries could not be told apart by (msg_id, ref), goes row by row.
    """
    won: list[Entry] = []
    lost: list[Entry] = []
    for chunk in chunks(group):
        keys = [(e.row[1], e.row[8]) for e in chunk]
        if len(set(keys)) < len(keys):
            for e in chunk:
                record_success(conn, e, won, lost)
            continue
        # e.row: (flow, msg_id, grp, seq, kept, partner_duplicate, at, source, ref);
        # processed_at, flow and source are the group's, bound once (`_insert_many`).
        r = chunk[0].row
        args: list[Any] = [r[6], r[0], r[7]]
        for e in chunk:
            r = e.row
            args += (r[1], r[2], r[3], r[4], r[5], r[8])
        try:
            back = set(conn.execute(_insert_many(len(chunk)), args).fetchall())
        except sqlite3.Error:
            if not conn.in_transaction:
                raise
            for e in chunk:  # the statement was undone: find the row it refused
                record_success(conn, e, won, lost)
            continue
        for e, key in zip(chunk, keys, strict=True):
            if key in back:
                won.append(e)
            else:  # the primary key refused a second copy
                e.kind, e.settle = DUPLICATE, ACK
                lost.append(e)
    return won, lost


def record_success(conn: Tx, e: Entry, won: list[Entry], lost: list[Entry]) -> None:
    # No SAVEPOINT around the insert (it cost two statements per message): when a
    # statement breaks a constraint, SQLite undoes that statement alone and keeps
    # the transaction (ON CONFLICT ABORT), which is exactly what a savepoint
    # would give. Only a constraint (a CHECK, a trigger's RAISE) refuses *this
    # message*; any other error (disk full, I/O, a broken trigger or schema) is the
    # ledger's and is re-raised: the group fails as one and its files stay for the
    # next run, instead of every good message being quarantined.
    try:
        row = conn.execute(
            _INSERT + _ROW + " ON CONFLICT(flow, msg_id) DO NOTHING RETURNING msg_id", e.row
        ).fetchone()
    except sqlite3.IntegrityError as exc:
        if not conn.in_transaction:
            raise
        e.kind, e.settle = REJECTED, DEAD
        e.reason, e.detail = "ledger-refused", str(exc)
        return
    if row is None:  # the primary key refused a second copy
        e.kind = DUPLICATE
        e.settle = ACK
        lost.append(e)
    else:
        won.append(e)


def failure_recorded(conn: Tx, flow: str, source: str, e: Entry) -> bool:
    """Did a crashed run already record this very copy's failure?

    Only a redelivered copy with a stable ref can tell (a file taken over from a
    dead consumer): if its newest failure row is newer than its newest replay,
    the crash fell between that commit and the move to error/, and only the
    move is left to do. Without this, every such crash would add a failure row.
    """
    d = e.delivery
    if not (d.redelivered and d.stable_ref):
        return False
    row = conn.execute(
        "SELECT max(at) FROM failures WHERE ref = ? AND flow = ? AND source = ?"
        " AND action = 'dead'",
        (text(d.ref), flow, source),
    ).fetchone()
    if row is None or row[0] is None:
        return False
    replayed = conn.execute(
        "SELECT max(at) FROM replays WHERE ref = ? AND flow = ?", (text(d.ref), flow)
    ).fetchone()
    return replayed is None or replayed[0] is None or replayed[0] < row[0]


def record_duplicate(conn: Tx, flow: str, source: str, e: Entry, now: str) -> None:
    d = e.delivery
    row = conn.execute(
        "SELECT ref, source FROM messages WHERE flow = ? AND msg_id = ?", (flow, d.msg_id)
    ).fetchone()
    if (
        d.stable_ref
        and d.redelivered
        and row is not None
        and row[0] == text(d.ref)
        and row[1] == source
    ):
        # The row names this very copy, taken over from a dead consumer (or redelivered
        # by the broker): we crashed after the commit and before the move/ack. It is
        # finished work, not a duplicate. A NEW copy that only shares the name (a file
        # re-sent as msg-001.json again) was never claimed before: it is a duplicate.
        e.recovered = True
        return
    new = conn.execute(
        "INSERT INTO duplicates (flow, msg_id, ref, seen_at) VALUES (?,?,?,?)"
        " ON CONFLICT(flow, msg_id, ref) DO NOTHING RETURNING msg_id",
        (flow, d.msg_id, text(d.ref), now),
    ).fetchone()
    if new is None and d.stable_ref and d.redelivered:
        # This very copy (a file taken over from a dead consumer) was already
        # recorded as a duplicate before the crash: only its move was left.
        e.recovered = True


# failures.action: what the failure led to.
ACTIONS = {REQUEUE: "requeue", DELAY: "delay", DEAD: "dead"}

# The most of a failure's detail that is stored, in characters. One message makes at
# most max_attempts rows per replay, so with the cap nothing one message does (a
# partner answering 503 with a 1 MB page, an exception quoting the whole document)
# grows the ledger without bound. Applied here, the one place a failure is written;
# the effects shorten their details too, but this is the one that holds.
DETAIL_CAP = 500


def record_failure(conn: Tx, flow: str, source: str, e: Entry, now: str) -> None:
    action = ACTIONS.get(e.settle, "dead")
    conn.execute(
        "INSERT INTO failures (flow, msg_id, ref, source, reason, detail, attempt,"
        " action, at, delay_s) VALUES (?,?,?,?,?,?,?,?,?,?)",
        (
            flow,
            # A failure row is the record of a message that went wrong, so nothing in
            # it may be refused: texts go through `text`.
            text(e.delivery.msg_id),
            text(e.delivery.ref),
            source,
            text(e.reason),
            # Cut before `text` (which walks the string), and cut again after: making a
            # lone surrogate safe may lengthen it.
            text(str(e.detail)[:DETAIL_CAP])[:DETAIL_CAP],
            e.attempt,
            action,
            now,
            float(e.delivery.delay) if action == "delay" else None,
        ),
    )
