"""The in-flight guard's session (`onceq._ledger.pg.guard.PgGuard`): how it connects,
and what it sends for an id PostgreSQL text cannot hold."""

from __future__ import annotations

from typing import Any

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
