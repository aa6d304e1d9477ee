"""One view of every flow: its queue's depths, the ledger's counts, its consumers' state.

    doc = gather(flow_file.flows, flow_file.ledger)         # or gather(None, "./ledger.db")

`onceq status` prints it (`--json` as it is); `--watch` calls it again and again and
adds rates (`onceq._ops.status_watch`). The shape, stable keys (documented in README.md):

    {"generated_at": ISO 8601 UTC,
     "ledger": {"target", "kind": sqlite|postgresql, "exists", "note", "error"},
     "flows": {NAME: {
        "source": "dirq" | "rabbitmq" | null (a --db view: the ledger only),
        "queue": {"kind": "dirq", "path", "inbox", "processing", "retry", "error",
                  "oldest_age_s"}
               | {"kind": "rabbitmq", "queues": [{"state": ready|retry|dead, "name",
                  "exists", "ready", "unacked", "consumers"}]} | null,
        "queue_error": null | why the queue could not be read (one line),
        "ledger": {"processed", "duplicates", "dead", "dead_by_reason": {reason: n}, "retried",
                   "failures"} | null (the ledger could not be read),
        "consumers": [{"consumer", "host", "pid", "started_at", "updated_at", "age_s",
                       "every_s", "status": running|stopped|stale, "stale", "breaker",
                       "in_flight", "connected", "stopping"}],
        "breaker": the breaker of the freshest running consumer, or null}}}

Nothing here may crash the whole view for one flow's trouble: a queue folder that is
missing, a broker that is down, a ledger that cannot be read are each the reason in
the entry they concern (redacted: no URL password). Nothing here writes: the queue
folders are only listed, the broker is read (passive declares, the management API),
the ledger is opened read-only (`onceq._ops.status_ledger`) and never created.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from onceq._core.redact import redact_text
from onceq._ops.status_ledger import LedgerView, empty_counts
from onceq._sources import registry
from onceq.errors import OnceqError

__all__ = ["gather", "gather_async"]


def gather(
    flows: Sequence[Any] | None,
    ledger_target: str | Path | None,
    *,
    api: str | None = None,
    now: datetime | None = None,
    names: Sequence[str] = (),
) -> dict[str, Any]:
    """The status of `flows` (None: every flow the ledger holds, ledger counts only)
    with counts from `ledger_target`. `api`: the management API override for the
    RabbitMQ flows (an http(s):// URL, or "off"; default `onceq._sources.amqp.depths`').
    `names`: without flows, only these flows of the ledger (0 counts for one it lacks)."""
    return asyncio.run(gather_async(flows, ledger_target, api=api, now=now, names=names))


async def gather_async(
    flows: Sequence[Any] | None,
    ledger_target: str | Path | None,
    *,
    api: str | None = None,
    now: datetime | None = None,
    names: Sequence[str] = (),
) -> dict[str, Any]:
    now = now or datetime.now(UTC)
    # The ledger read is blocking I/O (a PostgreSQL round trip): in a thread, beside the
    # broker reads, so one slow side does not add to the other.
    ledger_task = asyncio.create_task(asyncio.to_thread(_read_ledger, ledger_target, now))
    queues: list[tuple[dict[str, Any] | None, str | None]] = []
    if flows is not None:
        queues = list(await asyncio.gather(*(_queue(f, api, now) for f in flows)))
    view, ledger_doc = await ledger_task
    out: dict[str, Any] = {}
    if flows is not None:
        shown = [f.name for f in flows]
    else:
        shown = list(names) if names else (view.flows if view else [])
    for i, name in enumerate(shown):
        flow = flows[i] if flows is not None else None
        entry: dict[str, Any] = {"source": _kind(flow.source) if flow is not None else None}
        entry["queue"], entry["queue_error"] = queues[i] if flows is not None else (None, None)
        if view is None:
            entry["ledger"], entry["consumers"] = None, []
        else:
            entry["ledger"] = view.flow_counts(name) if view.exists else empty_counts()
            entry["consumers"] = view.consumers.get(name, [])
        running = [c for c in entry["consumers"] if c["status"] == "running"]
        entry["breaker"] = running[0]["breaker"] if running else None
        out[name] = entry
    return {
        "generated_at": now.isoformat(timespec="seconds"),
        "ledger": ledger_doc,
        "flows": out,
    }


def _read_ledger(
    target: str | Path | None, now: datetime
) -> tuple[LedgerView | None, dict[str, Any]]:
    if target is None:
        return None, {"target": None, "kind": None, "exists": False, "note": "no ledger named"}
    view = LedgerView(target)
    doc: dict[str, Any] = {"target": view.where, "kind": view.kind}
    try:
        view.read(now)
    except OnceqError as exc:
        doc.update(exists=None, note=None, error=redact_text(str(exc)))
        return None, doc
    doc.update(exists=view.exists, note=view.note, error=None)
    return view, doc


def _kind(source: Any) -> str | None:
    """The source's kind as status reports it: None for a library's own transport."""
    t = registry.of(source)
    return t.kind if t is not None and t.public else None


async def _queue(
    flow: Any, api: str | None, now: datetime
) -> tuple[dict[str, Any] | None, str | None]:
    """(the flow's queue depths, None) or (None, why they could not be read)."""
    t = registry.of(flow.source)
    try:
        if t is None:
            return None, "not a queue onceq status can read (a library transport)"
        return await t.status_depths(flow, api, now)
    except OnceqError as exc:
        return None, redact_text(str(exc))
    except Exception as exc:  # one flow's trouble is its entry's reason, not the view's end
        return None, redact_text(f"{type(exc).__name__}: {exc}")
