"""The in-flight guard's session (`onceq._ledger.pg.guard.PgGuard`): how it connects,
the function it makes for its batches, and what it sends for an id PostgreSQL text
cannot hold."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from onceq._core.values import text

CONNECT_TIMEOUT_S = 3
# Unless the URL says otherwise: find a dead server (or a dead path to it) in ~25 s.
KEEPALIVES = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
}


def sendable(msg_id: str) -> str:
    """msg_id as the guard sends it: PostgreSQL text cannot hold NUL, and one id that
    psycopg cannot send would fail the whole tick's batch (every claim in it). A
    decoder built from a spec refuses such ids; a library user's own decoder may not.
    The escaped form is a key like any other (the same id always maps to it), and the
    ledger refuses that message itself (ledger-refused), so its lookup finds nothing."""
    return text(msg_id) if "\x00" in msg_id else msg_id


def guard_conninfo(url: str) -> str:
    """The guard's connection string: the URL's, plus keepalives and a short connect
    timeout when it sets none, and its own application_name (seen in pg_stat_activity)."""
    given = conninfo_to_dict(url)
    extra: dict[str, Any] = {k: v for k, v in KEEPALIVES.items() if k not in given}
    extra.setdefault("connect_timeout", given.get("connect_timeout", CONNECT_TIMEOUT_S))
    extra["application_name"] = "onceq-guard"
    return make_conninfo(url, **extra)


# One statement per batch whatever its size (a prepared text for every batch size): the
# ids as one JSON text (`onceq._ledger.pg.sql.batch` says why not an array).
# It answers with the ids it could NOT lock, usually none: parsing a row per granted
# id cost more client CPU than the lock itself.
CLAIM_SQL = (
    "SELECT k FROM jsonb_array_elements_text(%s::text::jsonb) AS k"
    " WHERE NOT pg_try_advisory_lock(hashtextextended(%s || '/' || k, 0))"
)
# The duplicate check: of a claim batch, and `PgLedger.processed_refs`'s (one text for
# both, schema qualified: this session keeps the default search_path). In a claim
# batch, why it is correct:
# - it is a SEPARATE statement after CLAIM_SQL in the pipeline, never a subquery of
#   it: a statement's snapshot is taken when the statement starts, so a read inside
#   the claim statement would use a snapshot older than its own lock, and miss a twin
#   that committed and released between the two (the lock granted, the read stale:
#   the partner called twice). Under READ COMMITTED (forced on this session) each
#   statement takes a fresh snapshot, so this one sees every commit made before the
#   locks were granted;
# - a twin releases its lock only after its commit returned (commit → settle →
#   release, `onceq._core.consumer`), so when our lock is granted the twin's row is visible;
# - ids whose lock was refused are read too (one statement for the batch) but their
#   answer is dropped: they are claimed again, and read again after that lock.
# - one primary-key lookup per id, whatever the planner believes: a scalar subquery is
#   never flattened into a join. A join of the ids with messages, planned generic (a
#   prepared statement, a function's cached plan) while the ledger is young and its
#   statistics say it is empty, reads every row of the flow (bitmap scan on flow,
#   hash join) on every tick for as long as the session lives: 0.70 ms a tick at 3,000
#   rows in bench/pg_ledger.py, growing with the ledger (as `msg_id = ANY(array)` did
#   in `PgLedger.processed_refs`: 47 ms for 256 ids at 10k rows; this is 0.3 ms).
LOOKUP_SQL = (
    "SELECT id, found FROM (SELECT u.id, (SELECT coalesce(m.ref, '') FROM onceq.messages AS m"
    " WHERE m.flow = %s AND m.msg_id = u.id) AS found"
    " FROM jsonb_array_elements_text(%s::text::jsonb) AS u(id)) AS x"
    " WHERE found IS NOT NULL"
)
UNLOCK_SQL = (  # one row back whatever the batch's size
    "SELECT count(pg_advisory_unlock(hashtextextended(%s || '/' || k, 0)))"
    " FROM jsonb_array_elements_text(%s::text::jsonb) AS k"
)

# The batch in ONE statement (releases, claims, then the lookup), a function of the
# guard's session (pg_temp: nothing in the ledger's schema, gone with the session):
# half the client CPU and wall of the pipeline of three statements it replaces
# (measured: 113-128 µs against 241-247 µs of CPU, 180-231 µs against ~400 µs a
# batch of 2 claims and their releases), CPU the event loop spends per batch. Why
# its lookup is still correct: a VOLATILE function (the default) takes a fresh
# snapshot for each statement it runs under READ COMMITTED (forced on this session),
# so the lookup's snapshot is taken after the claim's locks were granted, as with
# LOOKUP_SQL sent after CLAIM_SQL; never one statement of SQL for both
# (see LOOKUP_SQL, whose form its lookup has: one primary-key probe per id, also in
# the plan the function caches for the session's life). Rows: an id whose lock was
# refused with a NULL ref (its refs, if any, are dropped: it is claimed and read
# again), an id found with its ref.
CLAIM_FN = """
CREATE OR REPLACE FUNCTION pg_temp.onceq_claim(f text, rel jsonb, ids jsonb)
RETURNS TABLE (id text, ref text) LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
  PERFORM pg_advisory_unlock(hashtextextended(f || '/' || k, 0))
    FROM jsonb_array_elements_text(rel) AS k;
  RETURN QUERY SELECT k, NULL::text FROM jsonb_array_elements_text(ids) AS k
    WHERE NOT pg_try_advisory_lock(hashtextextended(f || '/' || k, 0));
  RETURN QUERY SELECT x.k, x.hit FROM (SELECT u.k, (SELECT coalesce(m.ref, '')
    FROM onceq.messages AS m WHERE m.flow = f AND m.msg_id = u.k) AS hit
    FROM jsonb_array_elements_text(ids) AS u(k)) AS x WHERE x.hit IS NOT NULL;
END
$fn$"""
CLAIM_FN_CALL = (
    "SELECT id, ref FROM pg_temp.onceq_claim(%b::text, %b::text::jsonb, %b::text::jsonb)"
)


async def make_claim_fn(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Make CLAIM_FN on the guard's session; False where the server refuses (no TEMP
    privilege on the database, no plpgsql): the batch then goes as a pipeline."""
    try:
        await conn.execute(CLAIM_FN)
    except psycopg.Error:
        if conn.closed or conn.broken:
            raise  # a lost connection: `_connection` handles it as any other
        # Nothing to report: the pipeline does the same work, in more client CPU.
        return False
    return True
