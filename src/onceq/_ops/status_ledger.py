"""`onceq status`'s ledger side: counts per flow and the consumers' rows, read-only.

A status view is looked at while consumers run, often by someone who should not be
able to change anything: it reads through `onceq._ops.ledger_read.read_only`, a session
that cannot write, never creates a ledger (a missing one is a note) and sees one
snapshot (processed and dead letters add up at one instant).

Dead letters are the failures with action 'dead' that no replay has given their
retries back (the same rule as a message's attempts, `onceq._ledger.ops`): a replayed
message that dies again counts once, and one that succeeded after its replay not at all.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from onceq._ledger.target import describe, is_pg_url
from onceq._ops.heartbeat import STALE_AFTER
from onceq._ops.ledger_read import NoLedger, Rows, read_only

COUNTS = {
    "processed": "SELECT flow, count(*) FROM messages GROUP BY flow",
    "duplicates": "SELECT flow, count(*) FROM duplicates GROUP BY flow",
}
# Per flow and reason, in ONE pass over failures: every failure, those retried (at once
# or after a delay), and the dead letters — dead failures no replay has undone. A
# replay undoes the failures of its msg_id up to its reset_after (the replays are
# aggregated once and joined, not looked up per row: 33k dead rows cost 80-200 ms that
# way); a failure without msg_id (it never parsed) is matched to its replays by file
# (ref), as `record_replay` finds its message, only for those rows.
FAILURES = (
    "SELECT f.flow, f.reason, count(*),"
    " sum(CASE WHEN f.action <> 'dead' THEN 1 ELSE 0 END),"
    " sum(CASE WHEN f.action <> 'dead' THEN 0"
    " WHEN f.msg_id IS NOT NULL THEN CASE WHEN f.id > coalesce(rr.reset, 0) THEN 1 ELSE 0 END"
    " WHEN EXISTS (SELECT 1 FROM replays AS r WHERE r.flow = f.flow AND r.ref = f.ref"
    " AND r.at >= f.at) THEN 0 ELSE 1 END)"
    " FROM failures AS f LEFT JOIN (SELECT flow, msg_id, max(reset_after) AS reset"
    " FROM replays WHERE msg_id IS NOT NULL GROUP BY flow, msg_id) AS rr"
    " ON rr.flow = f.flow AND rr.msg_id = f.msg_id"
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
        try:
            with read_only(self.target) as reading:
                self._read(reading.rows, reading.tables, now)
        except NoLedger as exc:
            self.exists = False
            self.note = str(exc)
        return self

    def _read(self, rows: Rows, tables: frozenset[str], now: datetime) -> None:
        names: set[str] = set()
        for key, sql in COUNTS.items():
            for flow, n in rows(sql):
                self._flow(flow)[key] = int(n)
                names.add(flow)
        if "consumers" in tables:  # a schema-3 ledger no consumer of this release opened
            for row in rows(CONSUMERS):
                self.consumers.setdefault(row[0], []).append(consumer_row(row, now))
                names.add(row[0])
        for flow, reason, n, retried, dead in rows(FAILURES):
            entry = self._flow(flow)
            entry["failures"] += int(n)
            entry["retried"] += int(retried or 0)
            if dead:
                entry["dead_by_reason"][reason] = int(dead)
                entry["dead"] += int(dead)
            names.add(flow)
        self.flows = sorted(names)

    def _flow(self, flow: str) -> dict[str, Any]:
        return self.counts.setdefault(flow, empty_counts())

    def flow_counts(self, flow: str) -> dict[str, Any]:
        return self.counts.get(flow, empty_counts())


def empty_counts() -> dict[str, Any]:
    return {
        "processed": 0,
        "duplicates": 0,
        "dead": 0,
        "dead_by_reason": {},
        "failures": 0,
        "retried": 0,
    }


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
