"""The directory queue as a source type: `source = "dirq"` in a flow file, `DirSource` in Python.

Everything the generic layers ask of a directory-queue flow is answered here (its
flow-file keys, its checks, its workers, its depths for /metrics and `onceq status`,
its health); the registry (onceq._sources.registry) finds it by `DirSource`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from onceq._core.keys import Mistakes, get
from onceq._sources.dead_api import DeadAction, DeadItem, DeadSelection
from onceq._sources.dirq import dead_items, run
from onceq._sources.dirq.open import DirFeed
from onceq._sources.dirq.queue import DirQueue
from onceq._sources.dirq.scan import DirScan, dirq_depths
from onceq._sources.registry import SourceType

__all__ = ["DIRQ", "DirSource", "DirqType"]

MAX_WORKERS = 64  # a flow file's `workers`: processes on one machine, not a pool size


@dataclass(frozen=True)
class DirSource:
    """A directory queue at `path`; `workers` consumers on it (each its own claim folder)."""

    path: Path
    workers: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))


class DirqType(SourceType):
    kind = "dirq"
    config = DirSource
    file_keys = frozenset({"path", "workers"})
    fault_points = {  # noqa: RUF012  (onceq._core.faults; read only)
        "after-claim": "a file renamed into processing/w-ID/, not yet read",
        "after-retry-link": "a failure committed, its file linked into retry/, not yet"
        " unlinked from processing/ (two names)",
        "mid-replay": "dead replay: a file linked into inbox/, still in error/ too",
    }
    log_events = {  # noqa: RUF012  (onceq._core.logs.EVENTS has the engine's)
        "retry-time-unset": "a file's retry time could not be set: it is due at once",
    }

    def validate(self, source: DirSource, flow: Any, where: str) -> str | None:
        if not isinstance(source.workers, int) or source.workers < 1:
            return f"workers must be at least 1, not {source.workers}"
        if flow.message.id_property:
            return "id_property is a RabbitMQ property; a file has none"
        return None

    def copies(self, source: DirSource) -> int:
        return source.workers

    def from_table(
        self, table: dict[str, Any], where: str, base: Path, m: Mistakes
    ) -> DirSource | None:
        path = get(table, "path", str, m, where, required=True)
        workers = get(table, "workers", int, m, where, 1)
        if isinstance(workers, int) and not 1 <= workers <= MAX_WORKERS:
            m.add(f"{where}.workers", f"must be 1-{MAX_WORKERS}, not {workers}")
        return DirSource(base / path, workers) if path else None

    def depth_reader(self, flow: Any, transport: Any) -> DirScan:
        return DirScan(flow.source.path)

    async def status_depths(
        self, flow: Any, api: str | None, now: datetime
    ) -> tuple[dict[str, Any] | None, str | None]:
        # a scandir of a large inbox/ in a thread: status reads every flow at once
        return await asyncio.to_thread(dirq_depths, flow.source.path, now), None

    def labelled_depths(self, queue: dict[str, Any]) -> list[dict[str, Any]]:
        # The folders, as `dirq lag` names them, and the oldest inbox file's age.
        out = [
            {"key": k, "label": k, "value": queue.get(k), "unit": None}
            for k in ("inbox", "processing", "retry", "error")
        ]
        out.append(
            {"key": "oldest", "label": "oldest", "value": queue.get("oldest_age_s"), "unit": "s"}
        )
        return out

    def problem(self, flow: Any, transport: Any) -> str | None:
        root = Path(flow.source.path)
        if not (root / "inbox").is_dir():
            return f"queue folder {root} is gone"
        return None

    def flag_keys(self) -> dict[str, str]:
        return {"qdir": "path", "workers": "workers"}  # dirq consume QDIR --workers N

    def open(self, flow: Any, until_empty: bool) -> DirFeed:
        return DirFeed(flow, until_empty)

    def processes(self, source: DirSource) -> int:
        return source.workers  # `dirq consume --workers N`: N processes, each one consumer

    def fan_out(self, n: int, child: Any, watch: Any, ctx: Any) -> Any:
        return run.fan_out(n, child, watch, ctx)

    dead_actions = frozenset({"replay", "purge"})

    async def dead_items(
        self, flow: Any, ledger: Any, selection: DeadSelection, *, bodies: bool = False
    ) -> list[DeadItem]:
        queue = DirQueue(flow.source.path).check()
        return await asyncio.to_thread(dead_items.items, queue, ledger, selection, bodies=bodies)

    async def dead_action(
        self, action: str, flow: Any, ledger: Any, selection: DeadSelection
    ) -> DeadAction:
        if action not in self.dead_actions:
            return await super().dead_action(action, flow, ledger, selection)
        queue = DirQueue(flow.source.path).check()
        do = dead_items.replay if action == "replay" else dead_items.purge
        return await asyncio.to_thread(do, queue, ledger, selection)


DIRQ = DirqType()
