"""`dirq consume --workers N`: N consumer processes on one queue, as if started by hand.

Processes, not threads: each has its own claim folder and lock, exactly like
consumers started by hand, so this is the same code path a user scales out with.
Each child runs the one run path (onceq._flows.runner, handed in as `child`); this
module owns only what N processes need: the fork, the signals, the reports.

A stop signal to this process is passed on to every worker (each stops cleanly: it
claims nothing more, commits and moves what it holds, and leaves processing/ empty;
the rest stays in inbox/); a second one asks them to stop at once, which is as safe
as a kill -9 since whatever was claimed is recovered by the next run. A worker that
dies without reporting is named, never waited for forever.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import signal
from collections.abc import Callable
from typing import Any

from onceq import errors
from onceq._core import early
from onceq._core.stats import Stats
from onceq._core.stop import STOP_SIGNALS
from onceq._sources.dirq.open import DEAD_WORD
from onceq.errors import OnceqError

__all__ = ["Child", "fan_out"]

# What a child runs: child(its number, report) -> (its counts, the signal that stopped
# it or None); `report(snapshot dict)` sends its progress to the parent's metrics.
Child = Callable[[int, Callable[[dict[str, Any]], None]], tuple[Stats, int | None]]


def _child_main(i: int, out: Any, child: Child) -> None:
    """The body of one child: its result (or its error) on `out`, whatever happens.

    It puts ("ok", stats dict, signum | None), ("error", kind, message) or ("bug", kind,
    message), and meanwhile ("progress", i, snapshot) when the parent serves metrics.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent forwards a stop as SIGTERM
    try:
        # The counts only: the parent decides the run's end over every worker's sum.
        stats, signum = child(i, lambda d: out.put(("progress", i, d)))
        out.put(("ok", stats.as_dict(), signum))
    except OnceqError as exc:  # re-raised by the parent as the same kind (same exit code)
        out.put(("error", type(exc).__name__, str(exc)))
    except Exception as exc:  # a bug: reported to the parent, which raises it
        out.put(("bug", type(exc).__name__, str(exc)))


def fan_out(n: int, child: Child, watch: Any, ctx: Any) -> tuple[Stats, int | None]:
    """Run `child` in n forked processes; their summed counts and the first stop signal.

    `watch` is the parent's telemetry (onceq._ops.telemetry: `serving_in_thread`,
    `child_report`, `stopping`); `ctx` the fork context the caller made its shared
    state with (the guard's count). A worker's error is raised here as the same kind.
    """
    out: mp.Queue = ctx.Queue()
    # fork: the flow (and a user's functions in it) is inherited, never pickled.
    procs = [ctx.Process(target=_child_main, args=(i, out, child)) for i in range(n)]
    # Blocked from before the first fork: a signal can neither kill a worker before
    # its own handler is in place nor the parent while workers run; the parent takes
    # them with sigtimedwait and forwards them.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    # A signal that came while this command started (onceq._core.early kept it): no worker
    # is started, the run ends as stopped before it finished (130/143).
    stopped_by: list[int] = early.take()
    results: list[tuple[Any, ...]] = []
    try:
        if not stopped_by:
            for p in procs:
                p.start()
            with watch.serving_in_thread():
                results = _collect(procs, out, stopped_by, watch)
    finally:
        # Take a signal that came after the last report before unblocking: it belongs
        # to this run (it is reported below), not to whatever the caller does next.
        while (late := signal.sigtimedwait(STOP_SIGNALS, 0)) is not None:
            stopped_by.append(late.si_signo)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    return _total(results, stopped_by)


def _collect(
    procs: list[Any], out: mp.Queue, stopped_by: list[int], watch: Any
) -> list[tuple[Any, ...]]:
    """Every worker's report, forwarding stop signals meanwhile (and their progress to
    the metrics)."""
    results: list[tuple[Any, ...]] = []
    while len(results) < len(procs):
        info = signal.sigtimedwait(STOP_SIGNALS, 0.05)
        if info is not None:
            stopped_by.append(info.si_signo)
            watch.stopping()  # /healthz: 503 from the first stop signal
            # The first asks each worker to finish what it holds; a second, to stop now.
            for p in procs:
                if p.is_alive():
                    p.terminate()
        try:
            _take(out.get(timeout=0.05), results, watch)
            continue
        except queue_mod.Empty:
            pass
        if all(p.exitcode is not None for p in procs):
            while True:  # a report written just before its worker exited
                try:
                    _take(out.get(timeout=0.2), results, watch)
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


def _take(item: tuple[Any, ...], results: list[tuple[Any, ...]], watch: Any) -> None:
    """A child's message: its progress goes to the metrics, its result to `results`."""
    if item[0] == "progress":
        watch.child_report(item[1], item[2])
    else:
        results.append(item)


def _total(results: list[tuple[Any, ...]], stopped_by: list[int]) -> tuple[Stats, int | None]:
    total = Stats(dead_word=DEAD_WORD)
    for r in results:
        if r[0] == "ok":
            total.merge(r[1])
    bugs = [f"{r[1]}: {r[2]}" for r in results if r[0] == "bug"]
    if bugs:
        raise RuntimeError("; ".join(bugs))
    failed = [r for r in results if r[0] == "error"]
    if failed:
        _, name, message = failed[0]
        cls = getattr(errors, name, OnceqError)
        more = f" (and {len(failed) - 1} more worker error(s))" if len(failed) > 1 else ""
        raise cls(message + more)
    signum = (
        stopped_by[0]
        if stopped_by
        else next((r[2] for r in results if r[0] == "ok" and r[2]), None)
    )
    return total, signum
