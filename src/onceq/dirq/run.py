"""Consume a directory queue into the ledger, with one process or several.

A stop signal (SIGINT: Ctrl-C, SIGTERM: a service manager) ends a run cleanly: the
consumer claims nothing more, commits and moves what it holds, and leaves processing/
empty; the rest stays in inbox/ for the next run. The run then raises `Interrupted`
(exit 128 + the signal: 130, 143). A second signal stops at once; that is as safe as a
kill -9, since whatever was claimed is recovered by the next run.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue as queue_mod
import signal
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from onceq import errors
from onceq.consumer import Consumer, Stats
from onceq.dirq.message import MessageSpec, decode
from onceq.dirq.queue import DirQueue
from onceq.dirq.worker import Worker
from onceq.errors import OnceqError, UsageError
from onceq.ledger import Entry, Ledger
from onceq.processed_table import PROCESSED_TABLE

# One commit holds up to this many outcomes: large enough that the fsync is paid
# rarely, small enough that a crash re-runs little and memory stays flat.
GROUP = 256
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# A directory queue's dead letters are files in error/: its summaries (JSON and human)
# call them quarantined, the word its README and error/ folder use.
DEAD_WORD = "quarantined"


class Interrupted(OnceqError):
    """A stop signal ended the run cleanly; `stats` says what it settled first."""

    def __init__(self, root: str | Path, signum: int, stats: Stats) -> None:
        name = signal.Signals(signum).name
        super().__init__(
            f"{root}: stopped by {name} after {stats.received} message(s), each settled;"
            " the rest wait in inbox/"
        )
        self.exit_code = 128 + signum
        self.signum = signum
        self.signal_name = name
        self.stats = stats


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
    stopped_by: list[int] = []
    with (
        # The orders preset writes the exercise's `processed` table in the ledger's
        # transaction (onceq.processed_table), as 0.1.0 did.
        Ledger(db or queue.default_db, source="dirq", sql=PROCESSED_TABLE) as ledger,
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
        consumer.stats.dead_word = DEAD_WORD
        stats = asyncio.run(_run_stoppable(consumer, stopped_by))
    if stopped_by:
        raise Interrupted(root, stopped_by[0], stats)
    return stats


async def _run_stoppable(consumer: Consumer, stopped_by: list[int]) -> Stats:
    """Run the consumer; the first stop signal only stops the claiming (see the module)."""
    loop = asyncio.get_running_loop()
    installed: list[int] = []

    def on_signal(signum: int) -> None:
        if stopped_by:  # the second one: stop now, as the default handler would
            for s in installed:
                loop.remove_signal_handler(s)
            signal.raise_signal(signum)
            return
        stopped_by.append(signum)
        # A real stop (not the inbox running out): the worker claims nothing more, and
        # the loop starts no new handler call (with the ledger-row effect there is
        # none to start: everything claimed is recorded and moved).
        consumer.stop()

    # Signal handlers exist only in the main thread (a library caller may use another).
    # An ignored signal stays ignored: a --workers child ignores SIGINT (Ctrl-C reaches
    # the whole process group; the parent alone decides and forwards a SIGTERM).
    if threading.current_thread() is threading.main_thread():
        for s in STOP_SIGNALS:
            if signal.getsignal(s) is not signal.SIG_IGN:
                loop.add_signal_handler(s, on_signal, s)
                installed.append(s)
    # A --workers child starts with them blocked, so that none is lost or fatal before
    # this point; from here on they stop the run cleanly.
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, installed)
    try:
        return await consumer.run()
    finally:
        for s in installed:
            loop.remove_signal_handler(s)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _worker_main(root: str, db: str, spec: MessageSpec, out: mp.Queue) -> None:  # type: ignore[type-arg]
    """One --workers child: report ("ok", stats), ("stopped", signum, stats) or an error."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent forwards a stop as SIGTERM
    try:
        out.put(("ok", consume(root, db, spec).as_dict()))
    except Interrupted as exc:
        out.put(("stopped", exc.signum, exc.stats.as_dict()))
    except OnceqError as exc:  # re-raised by the parent as the same kind (same exit code)
        out.put(("error", type(exc).__name__, str(exc)))
    except Exception as exc:  # a bug: reported to the parent, which raises it
        out.put(("bug", type(exc).__name__, str(exc)))


def consume_parallel(
    root: str | Path, db: str | Path | None, spec: MessageSpec | None, workers: int
) -> Stats:
    """Run `workers` consumer processes on one queue and ledger; returns the summed stats.

    Processes, not threads: each has its own claim folder and lock, exactly like
    consumers started by hand, so this is the same code path a user scales out with.
    A stop signal to this process is passed on to every worker (each stops cleanly);
    a worker that dies without reporting is named, never waited for forever.
    """
    if workers < 1:
        raise UsageError(f"--workers must be at least 1, not {workers}")
    queue = DirQueue(root).check()
    spec = spec or MessageSpec()
    db_path = str(db or queue.default_db)
    # Create (or migrate) the schema once, before the workers race for it.
    Ledger(db_path, sql=PROCESSED_TABLE).close()
    if workers == 1:
        return consume(root, db_path, spec)
    ctx = mp.get_context("fork")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [
        ctx.Process(target=_worker_main, args=(str(root), db_path, spec, out))
        for _ in range(workers)
    ]
    # Blocked from before the first fork: a signal can neither kill a worker before
    # its own handler is in place nor the parent while workers run; the parent takes
    # them with sigtimedwait and forwards them.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    stopped_by: list[int] = []
    try:
        for p in procs:
            p.start()
        results = _collect(procs, out, stopped_by)
    finally:
        # Take a signal that came after the last report before unblocking: it belongs
        # to this run (it is reported below), not to whatever the caller does next.
        while (late := signal.sigtimedwait(STOP_SIGNALS, 0)) is not None:
            stopped_by.append(late.si_signo)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    return _total(root, results, stopped_by)


def _collect(procs: list[Any], out: mp.Queue, stopped_by: list[int]) -> list[tuple[Any, ...]]:  # type: ignore[type-arg]
    """Every worker's report, forwarding stop signals meanwhile."""
    results: list[tuple[Any, ...]] = []
    while len(results) < len(procs):
        info = signal.sigtimedwait(STOP_SIGNALS, 0.05)
        if info is not None:
            stopped_by.append(info.si_signo)
            # The first asks each worker to finish what it holds; a second, to stop now.
            for p in procs:
                if p.is_alive():
                    p.terminate()
        try:
            results.append(out.get(timeout=0.05))
            continue
        except queue_mod.Empty:
            pass
        if all(p.exitcode is not None for p in procs):
            while True:  # a report written just before its worker exited
                try:
                    results.append(out.get(timeout=0.2))
                except queue_mod.Empty:
                    break
            break
    for p in procs:
        p.join()
    if len(results) < len(procs):
        codes = sorted(str(p.exitcode) for p in procs)
        results.append(
            (
                "error",
                "OnceqError",
                f"{len(procs) - len(results)} worker(s) died without reporting (exit codes"
                f" {', '.join(codes)}); their claims are recovered by the next run",
            )
        )
    return results


def _total(root: str | Path, results: list[tuple[Any, ...]], stopped_by: list[int]) -> Stats:
    total = Stats(dead_word=DEAD_WORD)
    for r in results:
        if r[0] in ("ok", "stopped"):
            total.merge(r[-1])
    bugs = [f"{r[1]}: {r[2]}" for r in results if r[0] == "bug"]
    if bugs:
        raise RuntimeError("; ".join(bugs))
    failed = [r for r in results if r[0] == "error"]
    if failed:
        _, name, message = failed[0]
        cls = getattr(errors, name, OnceqError)
        more = f" (and {len(failed) - 1} more worker error(s))" if len(failed) > 1 else ""
        raise cls(message + more)
    signum = stopped_by[0] if stopped_by else next((r[1] for r in results if r[0] == "stopped"), 0)
    if signum:
        raise Interrupted(root, signum, total)
    return total
