"""`onceq status`'s ledger side: counts per flow and the consumers' rows, read-only.

A status view is looked at while consumers run, often by someone who should not be
able to change anything, so it opens the ledger in a way that cannot write:

- SQLite: a `mode=ro` URI. The file is never created (a missing ledger is a note, not
  a new empty ledger in front of a queue), never migrated, never switched to WAL;
  readers in WAL mode do not block the consumer's commits.
- PostgreSQL: a read-only session (`default_transaction_read_only`), every read in one
  transaction (one snapshot: processed and dead letters add up at one instant).

The SQL is written once with `?` placeholders (`onceq._ledger.pg.sql.translate` for
PostgreSQL), as the ledgers' shared queries are.

Dead letters are the failures with action 'dead' that no replay has given their
retries back (the same rule as a message's attempts, `onceq._ledger.ops`): a replayed
message that dies again counts once, and one that succeeded after its replay not at all.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from onceq._ledger.target import describe, is_pg_url
from onceq._ops.heartbeat import STALE_AFTER
from onceq.errors import LedgerError

COUNTS = {
    "processed": "SELECT flow, count(*) FROM messages GROUP BY flow",
    "duplicates": "SELECT flow, count(*) FROM duplicates GROUP BY flow",
}
# Per flow and reason; a failure without msg_id (it never parsed) is matched to its
# replays by file (ref), as `record_replay` finds its message.
DEAD = (
    "SELECT f.flow, f.reason, count(*) FROM failures AS f WHERE f.action = 'dead'"
    " AND f.id > coalesce((SELECT max(r.reset_after) FROM replays AS r WHERE r.flow = f.flow"
    " AND r.msg_id = f.msg_id), 0)"
    " AND NOT (f.msg_id IS NULL AND EXISTS (SELECT 1 FROM replays AS r WHERE r.flow = f.flow"
    " AND r.ref = f.ref AND r.at >= f.at))"
    " GROUP BY f.flow, f.reason"
)
CONSUMERS = (
    "SELECT flow, consumer, host, pid, started_at, updated_at, every_s, state FROM consumers"
    " ORDER BY flow, updated_at DESC"
)
FLOW_TABLES = ("messages", "duplicates", "failures", "consumers")


class LedgerView:
    """What the ledger says, per flow. `exists` False: no ledger there (counts 0)."""

    def __init__(self, target: str | Path) -> None:
        self.target = target
        self.kind = "postgresql" if is_pg_url(target) else "sqlite"
        self.where = describe(target)
        self.exists = True
        self.note: str | None = None
        self.counts: dict[str, dict[str, Any]] = {}
        self.consumers: dict[str, list[dict[str, Any]]] = {}
        self.flows: list[str] = []

    def read(self, now: datetime | None = None) -> LedgerView:
        """Read everything in one snapshot; LedgerError (one line) when it cannot."""
        now = now or datetime.now(UTC)
        with self._session() as session:
            if session is None:
                return self
            rows, tables = session
            self._read(rows, tables, now)
        return self

    @contextlib.contextmanager
    def _session(self) -> Iterator[Any]:
        if self.kind == "postgresql":
            # why: psycopg loads only for a PostgreSQL ledger (start-up of an SQLite status)
            from onceq._ops.pg_sessions import read_session

            with read_session(str(self.target), self.where) as s:
                if s is None:
                    self.exists = False
                    self.note = "no onceq ledger in this database yet (not created)"
                yield s
            return
        path = Path(self.target)
        if not path.exists():
            self.exists = False
            self.note = f"no ledger at {path} yet (not created)"
            yield None
            return
        with _sqlite_session(path) as s:
            yield s

    def _read(self, rows: Any, tables: set[str], now: datetime) -> None:
        if "messages" not in tables:
            self.exists = False
            self.note = "not an onceq ledger yet (no table messages)"
            return
        names: set[str] = set()
        for key, sql in COUNTS.items():
            for flow, n in rows(sql):
                self._flow(flow)[key] = int(n)
                names.add(flow)
        for flow, reason, n in rows(DEAD):
            entry = self._flow(flow)
            entry["dead_by_reason"][reason] = int(n)
            entry["dead"] += int(n)
            names.add(flow)
        if "consumers" in tables:  # a schema-3 ledger no consumer of this release opened
            for row in rows(CONSUMERS):
                self.consumers.setdefault(row[0], []).append(consumer_row(row, now))
                names.add(row[0])
        for flow, n in rows("SELECT flow, count(*) FROM failures GROUP BY flow"):
            self._flow(flow)["failures"] = int(n)
            names.add(flow)
        self.flows = sorted(names)

    def _flow(self, flow: str) -> dict[str, Any]:
        return self.counts.setdefault(flow, empty_counts())

    def flow_counts(self, flow: str) -> dict[str, Any]:
        return self.counts.get(flow, empty_counts())


def empty_counts() -> dict[str, Any]:
    return {"processed": 0, "duplicates": 0, "dead": 0, "dead_by_reason": {}, "failures": 0}


def consumer_row(row: Sequence[Any], now: datetime) -> dict[str, Any]:
    """One `consumers` row as status shows it: its state decoded, its age, stale or not."""
    _, consumer, host, pid, started_at, updated_at, every_s, state_text = row
    try:
        state = json.loads(state_text)
        if not isinstance(state, dict):
            state = {}
    except ValueError:
        state = {}
    try:
        age = max(0.0, (now - datetime.fromisoformat(updated_at)).total_seconds())
    except (TypeError, ValueError):
        age = None
    status = state.get("status", "running")
    # Dead without its final row: no beat for 3 periods. A stopped row is never stale.
    stale = status != "stopped" and (age is None or age > STALE_AFTER * float(every_s))
    return {
        "consumer": consumer,
        "host": host,
        "pid": int(pid),
        "started_at": started_at,
        "updated_at": updated_at,
        "age_s": None if age is None else round(age, 3),
        "every_s": float(every_s),
        "status": "stale" if stale else status,
        "stale": stale,
        "breaker": state.get("breaker"),
        "in_flight": state.get("in_flight"),
        "connected": state.get("connected"),
        "stopping": state.get("stopping"),
    }


@contextlib.contextmanager
def _sqlite_session(path: Path) -> Iterator[Any]:
    # mode=ro: SQLite refuses every write on this connection, and never makes the file.
    uri = f"file:{quote(str(path.resolve()))}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=10)
    except sqlite3.Error as exc:
        raise LedgerError(f"{path}: cannot read the ledger: {exc}") from None
    try:
        # One read transaction: every count from the same snapshot.
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
