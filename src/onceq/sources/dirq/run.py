"""Consume a directory queue into the ledger, with one process or several.

A stop signal (SIGINT: Ctrl-C, SIGTERM: a service manager) ends a run cleanly: the
consumer claims nothing more, commits and moves what it holds, and leaves processing/
empty; the rest stays in inbox/ for the next run. The run then raises `Interrupted`
(exit 128 + the signal: 130, 143). A second signal stops at once; that is as safe as a
kill -9, since whatever was claimed is recovered by the next run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing as mp
import queue as queue_mod
import signal
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceq import errors
from onceq.core import early
from onceq.core.consumer import Consumer, Stats
from onceq.errors import OnceqError, UsageError
from onceq.flows.runner import STOP_SIGNALS, Stop
from onceq.ledger.sqlite import Entry
from onceq.sources.dirq.queue import DirQueue
from onceq.sources.dirq.worker import Worker

if TYPE_CHECKING:
    from onceq.flows.flow import Flow
    from onceq.ops.telemetry import Telemetry

# One commit holds up to this many outcomes: large enough that the fsync is paid
# rarely, small enough that a crash re-runs little and memory stays flat.
GROUP = 256
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


def as_flow(target: Flow | str | Path, spec: Any = None) -> Flow:
    """A Flow for a directory queue: a path means the orders preset (today's consume).

    `spec` (a MessageSpec) replaces the flow's message spec, as `dirq consume
    --required/--max-bytes` did before flows.
    """
    from onceq.exercise.flows import orders_flow
    from onceq.flows.flow import Flow

    flow = target if isinstance(target, Flow) else orders_flow(target)
    if spec is not None:
        flow = dataclasses.replace(flow, message=spec)
    return flow.validate()


def consume(
    target: Flow | str | Path,
    db: str | Path | None = None,
    spec: Any = None,
    *,
    on_settled: Callable[[Sequence[Entry]], None] | None = None,
    telemetry: Telemetry | None = None,
) -> Stats:
    """Consume every message in the flow's inbox (and any a dead consumer left) into `db`.

    `target` is a Flow over a DirSource, or a queue folder (the orders preset).
    `telemetry` serves /metrics and /healthz for the run (its port bound first).
    Raises `Interrupted` (a signal), `Misconfigured` (the guard stopped the run) or
    `AllFailed` (every message failed; not under the orders preset), each with `stats`.
    """
    flow = as_flow(target, spec)
    stats = _batch(flow, db, on_settled, telemetry)
    raise_for(flow, stats)
    return stats


def raise_for(flow: Flow, stats: Stats) -> None:
    """A batch's end as an error: the guard stopped it (10), or every message failed (11)."""
    from onceq.core.misconfig import run_error

    error = run_error(flow.guard_policy(), stats, batch=True, where=str(flow.source.path))
    if error is not None:
        raise error


def _batch(
    flow: Flow,
    db: str | Path | None,
    on_settled: Callable[[Sequence[Entry]], None] | None,
    telemetry: Telemetry | None,
) -> Stats:
    """One consumer's batch under this process's signals; `Interrupted` after a signal."""
    from onceq.ops.telemetry import Telemetry

    stop = Stop(second="raise")
    tel = telemetry or Telemetry()
    tel.bind()
    stats = asyncio.run(_consume_stoppable(flow, db, stop, on_settled, tel))
    if stop.signals:
        raise Interrupted(flow.source.path, stop.signals[0], stats)
    return stats


async def _consume_stoppable(
    flow: Flow,
    db: str | Path | None,
    stop: Stop,
    on_settled: Callable[[Sequence[Entry]], None] | None,
    telemetry: Telemetry,
) -> Stats:
    """One batch under this process's signals: the first stops claiming (see the module)."""
    async with telemetry.serving():
        with stop.installed():
            return await consume_flow(
                flow, db, stop=stop, until_empty=True, on_settled=on_settled, telemetry=telemetry
            )


async def consume_flow(
    flow: Flow,
    db: str | Path | None,
    *,
    stop: Stop,
    until_empty: bool = True,
    on_settled: Callable[[Sequence[Entry]], None] | None = None,
    before_ledger: Callable[[], Awaitable[None]] | None = None,
    on_new_ledger: Callable[[str | Path], None] | None = None,
    telemetry: Telemetry | None = None,
) -> Stats:
    """One consumer of a directory-queue flow: the loop `dirq consume` and `onceq run` share.

    With `until_empty` it ends when nothing is left for it: inbox/ empty, nothing of
    its own unsettled, and nothing waiting in retry/ (it sleeps until the next retry
    is due; a stop wakes it). Otherwise it keeps looking at the queue (every
    POLL_SECONDS when idle) until `stop`. `before_ledger` is awaited once the
    queue folder is checked and before the ledger is opened (a run of several flows
    opens no ledger until every source is known good). `on_new_ledger(target)` is
    called when this open made the ledger's tables (it has seen no message).
    `telemetry` watches the consumer (its server is the caller's).
    """
    from onceq.ops.telemetry import Telemetry

    tel = telemetry or Telemetry()
    with tel.flow_context(flow.name):
        return await _consume_dir(
            flow, db, stop, until_empty, on_settled, before_ledger, on_new_ledger, tel
        )


async def _consume_dir(
    flow: Flow,
    db: str | Path | None,
    stop: Stop,
    until_empty: bool,
    on_settled: Callable[[Sequence[Entry]], None] | None,
    before_ledger: Callable[[], Awaitable[None]] | None,
    on_new_ledger: Callable[[str | Path], None] | None,
    telemetry: Telemetry,
) -> Stats:
    from onceq.core.consumer import no_effect
    from onceq.flows.flow import close_effect, open_ledger

    queue = DirQueue(flow.source.path).check()
    if before_ledger is not None:
        await before_ledger()
    if stop.requested:  # stopped while it started: nothing claimed, no ledger made
        return Stats(dead_word=DEAD_WORD)
    handler = flow.handler()
    try:
        with (
            open_ledger(flow, db or queue.default_db, "dirq") as ledger,
            Worker(queue, flow.message.max_bytes, follow=not until_empty) as worker,
        ):
            if ledger.created and on_new_ledger is not None:
                on_new_ledger(db or queue.default_db)
            # One Consumer for the whole run, not one per poll: the breaker's state
            # (and the loop's one-copy-in-flight guard) must outlive an idle moment.
            consumer = Consumer(
                worker,
                ledger,
                flow.message.decode,
                handler or no_effect,
                max_in_flight=_in_flight(flow, handler),
                max_group=GROUP,
                # The flow's policy: a transient failure waits in retry/ for its tier
                # (the orders preset's is RetryPolicy.none(): quarantined at once).
                retry=flow.retry_policy(),
                breaker=flow.breaker_policy(),
                on_settled=on_settled,
                guard=flow.misconfig_guard(),
            )
            consumer.stats.dead_word = DEAD_WORD
            stop.add(consumer.stop)
            try:
                async with telemetry.track(flow, consumer, worker):
                    return await consumer.run()
            finally:
                stop.discard(consumer.stop)
    finally:
        await close_effect(handler)


def _in_flight(flow: Flow, handler: object) -> int:
    """How many files one consumer holds claimed at once.

    The ledger row alone (no call): twice the group, one group being committed while
    the next is claimed. With a call: twice the effect's concurrency. The breaker is
    asked before each call, so every copy already past it when it opens is called
    anyway: with 512 claimed, an outage would try (and move into retry/) the whole
    queue before the breaker could hold anything. And a file claimed ahead of the
    partner's pace only moves the backlog from inbox/ (where `lag` sees it and
    another --workers consumer can take it) into our claim folder.
    """
    if handler is None:
        return 2 * GROUP
    return 2 * max(int(getattr(flow.effect, "concurrency", 5) or 1), 1)


def _worker_main(flow: Flow, db: str, out: mp.Queue, i: int, parent: Telemetry) -> None:
    """One --workers child: report ("ok", stats), ("stopped", signum, stats) or an error.

    With the parent's metrics on, it also reports ("progress", i, snapshot) every
    second and at its end, before its result: the parent serves the children's sum.
    """
    from onceq.ops.telemetry import Telemetry

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent forwards a stop as SIGTERM
    parent.close_inherited()  # the parent's port is the parent's: a child serves nothing
    tel = Telemetry(reporter=lambda d: out.put(("progress", i, d))) if parent.enabled else None
    try:
        # The counts only: the parent decides the run's end over every worker's sum.
        out.put(("ok", _batch(flow, db, None, tel).as_dict()))
    except Interrupted as exc:
        out.put(("stopped", exc.signum, exc.stats.as_dict()))
    except OnceqError as exc:  # re-raised by the parent as the same kind (same exit code)
        out.put(("error", type(exc).__name__, str(exc)))
    except Exception as exc:  # a bug: reported to the parent, which raises it
        out.put(("bug", type(exc).__name__, str(exc)))


def consume_parallel(
    target: Flow | str | Path,
    db: str | Path | None,
    spec: Any,
    workers: int,
    telemetry: Telemetry | None = None,
) -> Stats:
    """Run `workers` consumer processes on one queue and ledger; returns the summed stats.

    Processes, not threads: each has its own claim folder and lock, exactly like
    consumers started by hand, so this is the same code path a user scales out with.
    A stop signal to this process is passed on to every worker (each stops cleanly);
    a worker that dies without reporting is named, never waited for forever.
    With `telemetry` on, this process serves /metrics and /healthz: the children's
    reported counts summed, the queue's depths read by this process.
    """
    from onceq.ops.telemetry import Telemetry

    tel = telemetry or Telemetry()
    tel.bind()  # before the ledger: a port in use creates nothing
    if workers < 1:
        raise UsageError(f"--workers must be at least 1, not {workers}")
    from onceq.flows.flow import open_ledger

    flow = as_flow(target, spec)
    root = flow.source.path
    queue = DirQueue(root).check()
    db_path = str(db or queue.default_db)
    # Create the schema (and the flow's SQL setup) once, before the workers race for it.
    open_ledger(flow, db_path, "dirq").close()
    if workers == 1:
        return consume(flow, db_path, telemetry=tel)
    ctx = mp.get_context("fork")
    out: mp.Queue = ctx.Queue()
    flow = _shared_guard(flow, ctx)
    procs = [
        # fork: the flow (and a user's functions in it) is inherited, never pickled.
        ctx.Process(target=_worker_main, args=(flow, db_path, out, i, tel))
        for i in range(workers)
    ]
    # Blocked from before the first fork: a signal can neither kill a worker before
    # its own handler is in place nor the parent while workers run; the parent takes
    # them with sigtimedwait and forwards them.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    # A signal that came while this command started (onceq.core.early kept it): no worker
    # is started, the run ends as stopped before it finished (130/143).
    stopped_by: list[int] = early.take()
    results: list[tuple[Any, ...]] = []
    try:
        tel.expect_children(flow, workers)
        if not stopped_by:
            for p in procs:
                p.start()
            with tel.serving_in_thread():
                results = _collect(procs, out, stopped_by, tel)
    finally:
        # Take a signal that came after the last report before unblocking: it belongs
        # to this run (it is reported below), not to whatever the caller does next.
        while (late := signal.sigtimedwait(STOP_SIGNALS, 0)) is not None:
            stopped_by.append(late.si_signo)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    total = _total(root, results, stopped_by)
    raise_for(flow, total)
    return total


def _shared_guard(flow: Flow, ctx: Any) -> Flow:
    """The flow with one guard count for every child: "the first N" of the whole run.

    Each child counting its own would let W workers reject W x N files before all of
    them stopped; shared, the run stops after N plus what the others had in flight.
    """
    from onceq.core.misconfig import SharedTally

    policy = flow.guard_policy()
    if not policy.enabled:
        return flow
    return dataclasses.replace(flow, guard=dataclasses.replace(policy, shared=SharedTally(ctx)))


def _collect(
    procs: list[Any],
    out: mp.Queue,
    stopped_by: list[int],
    tel: Telemetry,
) -> list[tuple[Any, ...]]:
    """Every worker's report, forwarding stop signals meanwhile (and their progress to
    the metrics)."""
    results: list[tuple[Any, ...]] = []
    while len(results) < len(procs):
        info = signal.sigtimedwait(STOP_SIGNALS, 0.05)
        if info is not None:
            stopped_by.append(info.si_signo)
            tel.stopping()  # /healthz: 503 from the first stop signal
            # The first asks each worker to finish what it holds; a second, to stop now.
            for p in procs:
                if p.is_alive():
                    p.terminate()
        try:
            _take(out.get(timeout=0.05), results, tel)
            continue
        except queue_mod.Empty:
            pass
        if all(p.exitcode is not None for p in procs):
            while True:  # a report written just before its worker exited
                try:
                    _take(out.get(timeout=0.2), results, tel)
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


def _take(item: tuple[Any, ...], results: list[tuple[Any, ...]], tel: Telemetry) -> None:
    """A child's message: its progress goes to the metrics, its result to `results`."""
    if item[0] == "progress":
        tel.child_report(item[1], item[2])
    else:
        results.append(item)


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
