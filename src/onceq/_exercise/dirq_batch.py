"""A directory queue's batch run: `dirq consume` without its printing, in its words.

`consume_queue` runs a queue folder (the orders preset) or a directory-queue flow until
its inbox is empty (`onceq demo`, the lab's consume.py, the benchmarks); `queue_error`
is the error such a batch ends with, named by its folder (`dirq consume` too).
"""

from __future__ import annotations

from pathlib import Path

from onceq._core.stats import Stats
from onceq._exercise.orders import orders_flow
from onceq._flows.batch import run_report
from onceq._flows.flow import Flow
from onceq._flows.run_end import RunReport, run_error
from onceq._ops.telemetry import Telemetry
from onceq._sources.dirq.open import stopped_line
from onceq._sources.dirq.queue import DirQueue
from onceq.errors import OnceqError

__all__ = ["consume_queue", "queue_error"]


def consume_queue(
    target: Flow | str | Path,
    db: str | Path | None = None,
    *,
    workers: int = 1,
    telemetry: Telemetry | None = None,
) -> Stats:
    """A directory-queue flow's batch (`dirq consume` without its printing): its counts,
    or the error it ends with. A folder means the orders preset with `workers`
    processes; the ledger is the queue's own unless `db` names one (`onceq demo`, the
    lab's consume.py, the benchmarks)."""
    flow = target if isinstance(target, Flow) else orders_flow(target, workers=workers)
    ledger = db or DirQueue(flow.source.path).default_db
    report = run_report([flow], ledger, until_empty=True, telemetry=telemetry, processes=True)
    error = queue_error(report, flow)
    if error is not None:
        raise error
    return report.stats[flow.name]


def queue_error(report: RunReport, flow: Flow) -> OnceqError | None:
    """The error a directory queue's batch ends with (run_end's rule, in its words: the
    queue folder names it; a stop says how many were settled and that the rest wait)."""
    stats = report.stats[flow.name]
    return run_error(
        report,
        [flow],
        batch=True,
        where=lambda f: str(f.source.path),
        unfinished=lambda name, _aborted: stopped_line(flow.source.path, name, stats),
    )
