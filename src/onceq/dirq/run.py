"""Consume a directory queue into the ledger, with one process or several."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
from collections.abc import Callable, Sequence
from pathlib import Path

from onceq.consumer import Consumer, Stats
from onceq.dirq.message import MessageSpec, decode
from onceq.dirq.queue import DirQueue
from onceq.dirq.worker import Worker
from onceq.errors import UsageError
from onceq.ledger import Entry, Ledger

# One commit holds up to this many outcomes: large enough that the fsync is paid
# rarely, small enough that a crash re-runs little and memory stays flat.
GROUP = 256


def consume(
    root: str | Path,
    db: str | Path | None = None,
    spec: MessageSpec | None = None,
    *,
    on_settled: Callable[[Sequence[Entry]], None] | None = None,
) -> Stats:
    """Consume every message in QDIR/inbox (and any a dead consumer left) into `db`."""
    queue = DirQueue(root).check()
    spec = spec or MessageSpec()
    with (
        Ledger(db or queue.default_db, source="dirq") as ledger,
        Worker(queue, spec.max_bytes) as worker,
    ):
        consumer = Consumer(
            worker,
            ledger,
            lambda d: decode(d, spec),
            # Twice the group: one group is being committed while the next is claimed.
            max_in_flight=2 * GROUP,
            max_group=GROUP,
            # A directory queue has no redelivery: what fails once is quarantined.
            max_attempts=1,
            on_settled=on_settled,
        )
        return asyncio.run(consumer.run())


def _worker_main(root: str, db: str, spec: MessageSpec, out: mp.Queue) -> None:  # type: ignore[type-arg]
    try:
        out.put(("ok", consume(root, db, spec).as_dict()))
    except Exception as exc:  # reported to the parent, which raises it
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def consume_parallel(
    root: str | Path, db: str | Path | None, spec: MessageSpec | None, workers: int
) -> Stats:
    """Run `workers` consumer processes on one queue and ledger; returns the summed stats.

    Processes, not threads: each has its own claim folder and lock, exactly like
    consumers started by hand, so this is the same code path a user scales out with.
    """
    if workers < 1:
        raise UsageError(f"--workers must be at least 1, not {workers}")
    queue = DirQueue(root).check()
    spec = spec or MessageSpec()
    db_path = str(db or queue.default_db)
    Ledger(db_path).close()  # create the schema once, before the workers race for it
    if workers == 1:
        return consume(root, db_path, spec)
    ctx = mp.get_context("fork")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [
        ctx.Process(target=_worker_main, args=(str(root), db_path, spec, out))
        for _ in range(workers)
    ]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    errors = [msg for status, msg in results if status == "error"]
    if errors:
        raise RuntimeError("; ".join(errors))
    total = Stats()
    for _, d in results:
        for k in ("received", "processed", "duplicates", "recovered", "requeued", "dead"):
            setattr(total, k, getattr(total, k) + d[k])
        total.reasons.update(d["reasons"])
    return total
