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

Every lookup is an index seek, so a trace answers as fast on a ledger of millions of
rows as on an empty one: the flows are found by a loose index scan (one seek per
flow, `min(flow) … WHERE flow > ?`) over the indexes that lead with the flow, then
each flow is probed by (flow, msg_id). Only `dead_ops` (one row per operator command,
not per message) is read whole for a flow's purges. A file that never parsed has no
msg_id: it is found by its file name (`failures_ref`).
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
_FLOWS = (
    "WITH RECURSIVE f(flow) AS (SELECT min(flow) FROM {t} UNION ALL"
    " SELECT (SELECT min(flow) FROM {t} WHERE flow > f.flow) FROM f WHERE f.flow IS NOT NULL)"
    " SELECT flow FROM f WHERE flow IS NOT NULL"
)
_DONE = (
    "SELECT processed_at, partner_duplicate, ref, source, grp, seq, kept FROM messages"
    " WHERE flow = ? AND msg_id = ?"
)
_DUPLICATES = "SELECT seen_at, ref FROM duplicates WHERE flow = ? AND msg_id = ?"
_FAILURES = (
    "SELECT id, at, attempt, action, reason, detail, delay_s, ref, source FROM failures"
    " WHERE flow = ? AND msg_id = ? ORDER BY id"
)
_FAILURES_BY_REF = (
    "SELECT id, at, attempt, action, reason, detail, delay_s, ref, source, flow FROM failures"
    " WHERE ref = ? AND msg_id IS NULL ORDER BY id"
)
_REPLAYS = "SELECT id, at, ref, op, reset_after FROM replays WHERE flow = ? AND msg_id = ?"
_REPLAYS_BY_REF = (
    "SELECT id, at, ref, op, reset_after FROM replays WHERE flow = ? AND ref = ? AND msg_id IS NULL"
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
    rows = reading.rows
    names = list(dict.fromkeys(flows)) if flows else _flows(reading)
    found = [j for name in names if (j := _journey(reading, name, msg_id)) is not None]
    if found or "failures" not in reading.tables:
        return found
    # Not a msg_id anywhere: maybe the name of a file that never parsed.
    by_flow: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows(_FAILURES_BY_REF, (msg_id,)):
        if not flows or row[9] in flows:
            by_flow.setdefault(row[9], []).append(row[:9])
    out = []
    for name, failed in by_flow.items():
        steps = [_failure(r) for r in failed]
        steps += _replays(reading, name, rows(_REPLAYS_BY_REF, (name, msg_id)))
        out.append(_finish(Journey(name, None, "", steps)))
    return out


def _flows(reading: Reading) -> list[str]:
    names: set[str] = set()
    for table in _FLOW_INDEXED:
        if table in reading.tables:
            names.update(r[0] for r in reading.rows(_FLOWS.format(t=table)))
    return sorted(names)


def _journey(reading: Reading, flow: str, msg_id: str) -> Journey | None:
    rows, tables = reading.rows, reading.tables
    steps: list[Step] = []
    kept: dict[str, Any] = {}
    done = rows(_DONE, (flow, msg_id))
    if "failures" in tables:
        steps += [_failure(r) for r in rows(_FAILURES, (flow, msg_id))]
    if "replays" in tables:
        steps += _replays(reading, flow, rows(_REPLAYS, (flow, msg_id)))
    if "dead_ops" in tables and any(s.step == "dead" for s in steps):
        steps += _purges(reading, flow, msg_id)
    steps += [
        Step(at=at, step="duplicate", ref=ref) for at, ref in rows(_DUPLICATES, (flow, msg_id))
    ]
    if done:
        processed_at, partner_dup, ref, _source, grp, seq, kept_text = done[0]
        detail = "the partner already had it" if partner_dup else None
        steps.append(Step(at=processed_at, step="done", ref=ref, detail=detail))
        kept = _kept(kept_text, grp, seq)
    if not steps:
        return None
    return _finish(Journey(flow, msg_id, "", steps, kept))


def _failure(row: Sequence[Any]) -> Step:
    _id, at, attempt, action, reason, detail, delay_s, ref, _source = row
    return Step(
        at=at,
        step=_STEP_OF_ACTION.get(action, action),
        ref=ref,
        attempt=int(attempt),
        reason=reason,
        detail=detail or None,
        delay_s=None if delay_s is None else float(delay_s),
    )


def _replays(reading: Reading, flow: str, found: list[tuple[Any, ...]]) -> list[Step]:
    ops = _ops_of(reading, flow) if any(r[3] is not None for r in found) else {}
    return [
        Step(at=at, step="replayed", ref=ref, op=ops.get(op) if op is not None else None)
        for _id, at, ref, op, _reset in found
    ]


def _purges(reading: Reading, flow: str, msg_id: str) -> list[Step]:
    steps = []
    for op in _ops_of(reading, flow).values():
        if op["op"] == "purge" and msg_id in op.pop("_ids", ()):
            steps.append(Step(at=op["started_at"], step="purged", op=op))
    return steps


def _ops_of(reading: Reading, flow: str) -> dict[int, dict[str, Any]]:
    """The flow's dead-letter operations by id (their filter decoded; a purge's ids under
    `_ids`, for matching only: the list can be long and is not shown)."""
    out = {}
    for op_id, op, transport, filt, queue, started, finished, count, ids in reading.rows(
        _OPS, (flow,)
    ):
        out[int(op_id)] = {
            "id": int(op_id),
            "op": op,
            "transport": transport,
            "filter": _json(filt, {}),
            "queue": queue,
            "started_at": started,
            "finished_at": finished,
            "count": int(count),
            "_ids": set(_json(ids, [])) if op == "purge" else set(),
        }
    for entry in out.values():
        if entry["op"] != "purge":
            entry.pop("_ids")
    return out


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
        kept.setdefault("seq", seq)
    return kept
