"""How a command runs its flows: `run_report` (a new event loop, or `--workers` processes).

    report = run_report([flow], ledger, until_empty=True, telemetry=t, hooks=h)
    error = run_error(report, [flow], batch=True, where=…, unfinished=…)   # run_end

Every command (`dirq consume`, `mq consume`, `onceq run`) and the directory queue's
batch (onceq._exercise.dirq_batch) come through here to the one run path,
`onceq._flows.runner.run_flows`. With
`processes` (`dirq consume --workers N`) a flow whose source type forks (a directory
queue: N consumer processes, as if started by hand) runs one consumer per child; the
parent checks the source, makes the ledger once, serves the metrics and sums.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing as mp
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceq._core import loop as event_loop
from onceq._core.hooks import RunHooks
from onceq._core.misconfig import SharedTally
from onceq._core.stats import Stats
from onceq._core.stop import Stop
from onceq._flows.flow import Flow, open_ledger
from onceq._flows.run_end import RunReport
from onceq._flows.runner import check_flows, run_flows, source_type
from onceq._ledger.target import as_target
from onceq._ops.telemetry import Telemetry

if TYPE_CHECKING:
    from onceq._sources.feed import Feed
    from onceq._sources.registry import SourceType

__all__ = ["run_report"]


def run_report(
    flows: Sequence[Flow],
    ledger: str | Path,
    *,
    until_empty: bool = False,
    max_seconds: float | None = None,
    telemetry: Telemetry | None = None,
    hooks: RunHooks | None = None,
    stop: Stop | None = None,
    processes: bool = False,
) -> RunReport:
    """`run_flows` from a command: a new event loop, or with `processes` (`dirq consume
    --workers N`) one flow's consumers in the processes its source type forks."""
    if processes and len(flows) == 1:
        flow = check_flows(flows)[0]
        st = source_type(flow)
        n = st.processes(flow.source)
        if n > 1:
            return _forked(flow, st, n, ledger, until_empty, telemetry or Telemetry(), hooks)
    return event_loop.run(
        run_flows(
            flows,
            ledger,
            until_empty=until_empty,
            max_seconds=max_seconds,
            telemetry=telemetry,
            hooks=hooks,
            stop=stop,
        )
    )


def _forked(
    flow: Flow,
    st: SourceType,
    n: int,
    ledger: str | Path,
    until_empty: bool,
    tel: Telemetry,
    hooks: RunHooks | None,
) -> RunReport:
    """One flow's n consumers in n processes (`dirq consume --workers N`): the source
    type forks them; each runs `run_flows` with one consumer; this process sums them."""
    tel.bind()  # before the source and the ledger: a port in use creates nothing
    report = RunReport(as_target(ledger, "ledger"))
    feed = st.open(flow, until_empty)
    asyncio.run(_check(feed))
    # Create the schema (and the flow's SQL setup) once, before the workers race for it.
    with open_ledger(flow, report.ledger, feed.tag) as book:
        if book.created:
            report.created = True
            for fn in (hooks or RunHooks()).ledger_created:
                fn(report.ledger)
    ctx = mp.get_context("fork")
    flow = _shared_guard(flow, ctx)
    tel.expect_children(flow, n)

    def child(i: int, progress: Callable[[dict[str, Any]], None]) -> tuple[Stats, int | None]:
        tel.close_inherited()  # the parent's port is the parent's: a child serves nothing
        own = Telemetry(reporter=progress) if tel.enabled else None
        got = event_loop.run(
            run_flows([flow], report.ledger, until_empty=until_empty, telemetry=own, copies=1)
        )
        return got.stats[flow.name], got.signal

    total, signum = st.fan_out(n, child, tel, ctx)
    report.stats[flow.name] = total
    report.signal = signum
    return report


async def _check(feed: Feed) -> None:
    """The source checked by this process, before any ledger is made (nothing consumed)."""
    try:
        await feed.check()
    finally:
        await feed.aclose()


def _shared_guard(flow: Flow, ctx: Any) -> Flow:
    """The flow with one guard count for every child: "the first N" of the whole run.

    Each child counting its own would let W workers reject W x N files before all of
    them stopped; shared, the run stops after N plus what the others had in flight.
    """
    policy = flow.guard_policy()
    if not policy.enabled:
        return flow
    return dataclasses.replace(flow, guard=dataclasses.replace(policy, shared=SharedTally(ctx)))
