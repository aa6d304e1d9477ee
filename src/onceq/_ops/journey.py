"""One message's journey, read from the ledger: `onceq trace ID` and the console's message view.

What the ledger records of a message, in time order:

| ledger row | step | what happened |
|---|---|---|
| `failures`, action `requeue` | `retry` | an attempt failed; tried again at once |
| `failures`, action `delay` | `delayed` | an attempt failed; tried after `delay_s` |
| `failures`, action `dead` | `dead` | an attempt failed for good: dead-lettered |
| `replays` (+ `dead_ops`) | `replayed` | an operator gave it its retries back |
| `dead_ops` purge naming it | `purged` | an operator removed its dead letter |
| `duplicates` | `duplicate` | a later copy was refused: no call, acked |
| `messages` | `done` | its effect took place; later copies are duplicates |

The final `state` is `done` when the messages row exists, else the last of dead,
purged, replayed (waiting for its new attempt), retrying. The ledger keeps no row for
a copy that was received and succeeded at the first attempt other than `messages`, so
such a journey is one step.

A trace is two statements (two round trips to a PostgreSQL server) of index seeks
only, so it answers as fast on a ledger of millions of rows as on an empty one: the
flows, found by a loose index scan (one seek per flow, `min(flow) … WHERE flow > ?`)
over the indexes that lead with the flow (skipped with --flow); then one statement
probes every table by (flow, msg_id) for those flows.
Only `dead_ops` (one row per operator command, not per message) is read whole, for a
flow's replays and purges, and only when the journey has one. A file that never parsed
has no msg_id: it is found by its file name (`failures_ref`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from onceq._ops.ledger_read import Reading, read_only

__all__ = ["Journey", "Step", "trace", "trace_in"]

# The tables whose index leads with the flow: where a flow holding the id can be.
_FLOW_INDEXED = ("messages", "failures", "duplicates")
# A loose index scan: the distinct flows of a table in one seek each (SQLite and
# PostgreSQL both answer `min(flow) WHERE flow > ?` from the index's first column).
_SCAN = (
    "{c}(flow) AS (SELECT min(flow) FROM {t} UNION ALL"
    " SELECT (SELECT min(flow) FROM {t} WHERE flow > {c}.flow) FROM {c}"
    " WHERE {c}.flow IS NOT NULL)"
)
# One row shape for every table's rows of the message, so that a trace is ONE
# statement (one round trip to a PostgreSQL server): (what, flow, at, row id, attempt,
# action, reason, detail, delay_s, ref, op, extra). The first branch types the columns
# (PostgreSQL takes a UNION's types from it).
_BRANCH = {
    # A done row carries its group in `reason`, its seq in `attempt`, partner_duplicate
    # in `detail` and the kept fields in `extra`.
    "messages": "SELECT 'done', m.flow, m.processed_at, CAST(NULL AS BIGINT),"
    " CAST(m.seq AS BIGINT), CAST(NULL AS TEXT), m.grp,"
    " CAST(m.partner_duplicate AS TEXT), CAST(NULL AS DOUBLE PRECISION), m.ref,"
    " CAST(NULL AS BIGINT), m.kept"
    " FROM flows JOIN messages AS m ON m.flow = flows.flow AND m.msg_id = ?1",
    "failures": "SELECT 'failure', f.flow, f.at, f.id, f.attempt, f.action, f.reason, f.detail,"
    " f.delay_s, f.ref, NULL, NULL"
    " FROM flows JOIN failures AS f ON f.flow = flows.flow AND f.msg_id = ?1",
    "replays": "SELECT 'replayed', r.flow, r.at, r.id, NULL, NULL, NULL, NULL, NULL, r.ref,"
    " r.op, NULL FROM flows JOIN replays AS r ON r.flow = flows.flow AND r.msg_id = ?1",
    "duplicates": "SELECT 'duplicate', d.flow, d.seen_at, NULL, NULL, NULL, NULL, NULL, NULL,"
    " d.ref, NULL, NULL FROM flows JOIN duplicates AS d ON d.flow = flows.flow"
    " AND d.msg_id = ?1",
}
_BY_REF = (
    "SELECT 'failure', f.flow, f.at, f.id, f.attempt, f.action, f.reason, f.detail,"
    " f.delay_s, f.ref, NULL, NULL FROM failures AS f WHERE f.ref = ?1 AND f.msg_id IS NULL"
)
_REPLAYS_BY_REF = (
    "SELECT 'replayed', r.flow, r.at, r.id, NULL, NULL, NULL, NULL, NULL, r.ref, r.op, NULL"
    " FROM replays AS r WHERE r.ref = ?1 AND r.msg_id IS NULL AND r.flow = ?2"
)
_OPS = (
    "SELECT id, op, transport, filter, queue, started_at, finished_at, count, ids FROM dead_ops"
    " WHERE flow = ? ORDER BY id"
)
_STEP_OF_ACTION = {"requeue": "retry", "delay": "delayed", "dead": "dead"}
# The order of steps stamped at the same instant (a dead-lettering and its replay can
# share a millisecond on a fast machine): the order they can only happen in.
# A copy refused in the same group commit as the one that took effect is stamped with
# the same instant: done before duplicate.
_RANK = {"retry": 0, "delayed": 0, "dead": 1, "purged": 2, "replayed": 2, "done": 3}


@dataclass
class Step:
    """One thing that happened to the message, as the ledger recorded it."""

    at: str
    step: str  # retry | delayed | dead | replayed | purged | duplicate | done
    ref: str | None = None  # the file / delivery it happened to
    attempt: int | None = None
    reason: str | None = None  # parse, missing-field, http-422, timeout …
    detail: str | None = None
    delay_s: float | None = None
    op: dict[str, Any] | None = None  # the dead_ops row of a replay or purge


@dataclass
class Journey:
    """A message's journey through one flow."""

    flow: str
    msg_id: str | None  # None: a file that never parsed, found by its name
    state: str  # done | dead | purged | replayed | retrying
    steps: list[Step] = field(default_factory=list)
    kept: dict[str, Any] = field(default_factory=dict)  # the flow's keep fields, when done

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def trace(target: str | Path, msg_id: str, flows: Sequence[str] = ()) -> list[Journey]:
    """The journeys of `msg_id` in the ledger at `target`, one per flow holding it (only
    `flows` when given); [] when no flow holds it. NoLedger / LedgerError when the
    ledger is missing or cannot be read."""
    with read_only(target) as reading:
        return trace_in(reading, msg_id, flows)


def trace_in(reading: Reading, msg_id: str, flows: Sequence[str] = ()) -> list[Journey]:
    """`trace` over an open read-only session (the console keeps one per request)."""
    names = list(dict.fromkeys(flows)) or [r[0] for r in reading.rows(_flows(reading.tables))]
    by_flow = _group(reading.rows(*_statement(reading.tables, msg_id, names))) if names else {}
    if not by_flow and "failures" in reading.tables:
        # Not a msg_id anywhere: maybe the name of a file that never parsed.
        for flow, found in _group(reading.rows(_BY_REF, (msg_id,))).items():
            if not flows or flow in flows:
                by_flow[flow] = found
                if "replays" in reading.tables:
                    found += reading.rows(_REPLAYS_BY_REF, (msg_id, flow))
        return [_journey(reading, flow, None, found) for flow, found in sorted(by_flow.items())]
    return [_journey(reading, flow, msg_id, found) for flow, found in sorted(by_flow.items())]


def _statement(
    tables: frozenset[str], msg_id: str, flows: Sequence[str]
) -> tuple[str, tuple[str, ...]]:
    """The statement of a trace: every table's rows of the message in `flows`.

    The flows are a VALUES list, not a subquery: PostgreSQL then knows how few they
    are and seeks each table's index once per flow (from the recursive scan it
    guessed 300 flows and read small tables whole)."""
    values = ", ".join(f"(?{i + 2})" for i in range(len(flows)))
    branches = " UNION ALL ".join(sql for t, sql in _BRANCH.items() if t in tables)
    return f"WITH flows(flow) AS (VALUES {values}) {branches}", (msg_id, *flows)


def _flows(tables: frozenset[str]) -> str:
    """The statement listing every flow of the ledger: loose index scans, one seek per flow."""
    scans = [(f"f{i}", t) for i, t in enumerate(_FLOW_INDEXED) if t in tables]
    ctes = ", ".join(_SCAN.format(c=c, t=t) for c, t in scans)
    union = " UNION ".join(f"SELECT flow FROM {c} WHERE flow IS NOT NULL" for c, _ in scans)
    return f"WITH RECURSIVE {ctes} {union}"


def _group(rows: list[tuple[Any, ...]]) -> dict[str, list[tuple[Any, ...]]]:
    out: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows:
        out.setdefault(row[1], []).append(row)
    return out


def _journey(
    reading: Reading, flow: str, msg_id: str | None, found: list[tuple[Any, ...]]
) -> Journey:
    steps: list[Step] = []
    kept: dict[str, Any] = {}
    ops: _Ops | None = None  # the flow's dead_ops, read once, only when a step needs them
    for what, _flow, at, _id, attempt, action, reason, detail, delay_s, ref, op, extra in found:
        if what == "failure":
            steps.append(_failure(at, attempt, action, reason, detail, delay_s, ref))
        elif what == "done":
            partner = "the partner already had it" if detail not in (None, "0") else None
            steps.append(Step(at=at, step="done", ref=ref, detail=partner))
            kept = _kept(extra, reason, attempt)
        elif what == "replayed":
            if op is not None and ops is None:
                ops = _ops_of(reading, flow)
            shown = ops.shown.get(int(op)) if ops is not None and op is not None else None
            steps.append(Step(at=at, step="replayed", ref=ref, op=shown))
        else:
            steps.append(Step(at=at, step=what, ref=ref))
    if msg_id is not None and "dead_ops" in reading.tables and any(s.step == "dead" for s in steps):
        ops = ops if ops is not None else _ops_of(reading, flow)
        steps += [
            Step(at=ops.shown[i]["started_at"], step="purged", op=ops.shown[i])
            for i, ids in ops.purged.items()
            if msg_id in ids
        ]
    return _finish(Journey(flow, msg_id, "", steps, kept))


def _failure(
    at: str, attempt: Any, action: str, reason: str, detail: str, delay_s: Any, ref: str
) -> Step:
    return Step(
        at=at,
        step=_STEP_OF_ACTION.get(action, action),
        ref=ref,
        attempt=int(attempt),
        reason=reason,
        detail=detail or None,
        delay_s=None if delay_s is None else float(delay_s),
    )


@dataclass
class _Ops:
    """A flow's dead-letter operations: each as a journey shows it, by id, and the ids
    each purge removed (for matching only: the list can be long and is not shown)."""

    shown: dict[int, dict[str, Any]]
    purged: dict[int, set[str]]


def _ops_of(reading: Reading, flow: str) -> _Ops:
    ops = _Ops({}, {})
    for op_id, op, transport, filt, queue, started, finished, count, ids in reading.rows(
        _OPS, (flow,)
    ):
        ops.shown[int(op_id)] = {
            "id": int(op_id),
            "op": op,
            "transport": transport,
            "filter": _json(filt, {}),
            "queue": queue,
            "started_at": started,
            "finished_at": finished,
            "count": int(count),
        }
        if op == "purge":
            ops.purged[int(op_id)] = set(_json(ids, []))
    return ops


def _finish(j: Journey) -> Journey:
    j.steps.sort(key=lambda s: (_when(s.at), _RANK.get(s.step, 4)))  # stable: row order
    j.state = _state(j.steps)
    return j


def _state(steps: list[Step]) -> str:
    if any(s.step == "done" for s in steps):
        return "done"
    for s in reversed(steps):
        if s.step in ("dead", "purged", "replayed"):
            return s.step
        if s.step in ("retry", "delayed"):
            return "retrying"
    return "seen"


def _when(at: str) -> datetime:
    try:
        t = datetime.fromisoformat(at)
    except (TypeError, ValueError):
        return datetime.min.replace(tzinfo=UTC)
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _json(text: Any, default: Any) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return default


def _kept(text: Any, grp: Any, seq: Any) -> dict[str, Any]:
    kept = _json(text, {})
    kept = kept if isinstance(kept, dict) else {}
    if grp is not None:
        kept.setdefault("group", grp)
    if seq is not None:
        kept.setdefault("seq", int(seq))
    return kept
