"""The one run path: every way in builds flows and calls `run_flows` (a command: through
`onceq._flows.batch.run_report`).

    onceq.run(flow_a, flow_b, ledger="ledger.db", until_empty=True)  ->  {name: Stats}
    onceq.run(flow_a, ledger="postgresql://onceq:PW@db:5432/app")   # a shared ledger

`dirq consume`, `mq consume`, `onceq run FILE`, `onceq.run()` and the lab's scripts
all come here. Signals, telemetry, the ledger and the Consumer are wired in this
module only; what is a source's own (a queue folder's check and claim folder, a
broker's connection, its grace, `--workers` processes) is asked of the flow's source
type (onceq._sources.registry: `open` gives a Feed, onceq._sources.feed). The run ends
with a `RunReport`; what that means for an exit code is `onceq._flows.run_end`'s one
rule, applied by the caller.

Each flow gets its own ledger object on the same ledger (an SQLite file: its write
lock and `BEGIN IMMEDIATE` serialise their commits; a PostgreSQL database: one
connection each; dedup is per flow, so two flows never refuse each other's ids).

Order of a start: every source is checked first (the queue folder exists, the
broker has the queue), then the ledger is opened, then consuming starts; so a
refused run leaves no ledger file and consumes nothing. The deadline (`max_seconds`)
counts from then.

Stopping is one decision for all flows (onceq._core.stop.Stop): the first
SIGINT/SIGTERM (or `max_seconds`) stops every flow cleanly (nothing new is taken;
what is held is recorded and settled); a second one stops the process at once,
which is as safe as a kill -9 (unsettled copies come back: the broker requeues them,
the next run of a directory queue recovers its claims) — or, for a service's stop
(`mq consume`: `Stop(second="abort")`), cuts its grace short. A flow whose
misconfiguration guard trips stops the others cleanly too; a flow that fails (a
ledger error) stops the others, then its error is raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from onceq._core import loop as event_loop
from onceq._core.consumer import Consumer, Stats, no_effect
from onceq._core.hooks import RunHooks
from onceq._core.stop import STOP_SIGNALS, Stop
from onceq._flows.flow import Flow, close_effect, open_ledger
from onceq._flows.run_end import RunReport, run_error
from onceq._ledger.target import Target, as_target
from onceq._ops.telemetry import OpsOptions, Telemetry
from onceq._sources import registry
from onceq.errors import UsageError

if TYPE_CHECKING:
    from onceq._sources.feed import Feed
    from onceq._sources.registry import SourceType

__all__ = ["STOP_SIGNALS", "Gate", "RunReport", "Stop", "run", "run_async", "run_flows"]


class Gate:
    """Every source checked before any ledger is opened: a refused run creates nothing."""

    def __init__(self, parties: int) -> None:
        self._left = parties
        self._open = asyncio.Event()
        self._on_open: list[Callable[[], None]] = []
        if parties <= 0:
            self._open.set()

    def on_open(self, fn: Callable[[], None]) -> None:
        self._on_open.append(fn)

    async def arrive(self) -> None:
        self._left -= 1
        if self._left <= 0 and not self._open.is_set():
            self._open.set()
            for fn in self._on_open:
                fn()
        await self._open.wait()

    @property
    def passed(self) -> bool:
        return self._open.is_set()


def source_type(flow: Flow) -> SourceType:
    st = registry.of(flow.source)
    if st is None:  # validate() refused it already: a guard for a flow built by hand
        raise UsageError(f"flow {flow.name!r}: {type(flow.source).__name__} is not a source")
    return st


def check_flows(flows: Sequence[Flow]) -> list[Flow]:
    """Each flow valid and named once (two flows of one name would share their dedup)."""
    if not flows:
        raise UsageError("no flow to run")
    seen: set[str] = set()
    for f in flows:
        if not isinstance(f, Flow):
            raise UsageError(f"{f!r}: not a Flow")
        f.validate()
        if f.name in seen:
            raise UsageError(f"flow {f.name!r}: named twice; each flow needs its own name")
        seen.add(f.name)
    return list(flows)


def run(
    *flows: Flow,
    ledger: str | Path,
    until_empty: bool = False,
    max_seconds: float | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
) -> dict[str, Stats]:
    """Run the flows until stopped (or, with `until_empty`, until every source is empty).

    Returns each flow's counts by name. Signals are handled only when called from
    the main thread; `max_seconds` stops every flow cleanly after that long.
    `metrics_port` serves /metrics and /healthz on metrics_host:metrics_port for
    the run (a port in use: `Conflict` before anything is touched).
    """
    return event_loop.run(
        run_async(
            *flows,
            ledger=ledger,
            until_empty=until_empty,
            max_seconds=max_seconds,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
        )
    )


async def run_async(
    *flows: Flow,
    ledger: str | Path,
    until_empty: bool = False,
    max_seconds: float | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
) -> dict[str, Stats]:
    """`run` inside a running event loop."""
    telemetry = Telemetry(OpsOptions(metrics_port=metrics_port, metrics_host=metrics_host))
    report = await run_flows(
        flows, ledger, until_empty=until_empty, max_seconds=max_seconds, telemetry=telemetry
    )
    # The guard's trip and a batch that only failed are errors; a stop is not.
    error = run_error(report, flows, batch=until_empty, where=lambda f: f"flow {f.name}")
    if error is not None:
        raise error
    return report.stats


async def run_flows(
    flows: Sequence[Flow],
    ledger: str | Path,
    *,
    until_empty: bool = False,
    max_seconds: float | None = None,
    telemetry: Telemetry | None = None,
    hooks: RunHooks | None = None,
    stop: Stop | None = None,
    copies: int | None = None,
) -> RunReport:
    """Run `flows` side by side in this loop until they end or the stop; the report.

    `telemetry` serves /metrics and /healthz from before any source is checked until
    every flow's final counts are in; `hooks` tells a caller each consumer that starts
    (its progress line) and a ledger this run made. `stop`: the caller's kind of stop
    (default: a second signal ends the process). `copies` overrides the consumers a
    source asks for (a --workers child runs one).
    """
    tel = telemetry or Telemetry()
    flows = check_flows(flows)
    tel.bind()  # before any source or ledger: a port in use touches nothing
    if max_seconds is not None and not max_seconds > 0:
        raise UsageError(f"max_seconds must be a positive number, not {max_seconds}")
    # Checked before any source: a mistyped URL is refused (exit 2) with nothing touched.
    # A URL stays a str: Path() would fold its `//`.
    report = RunReport(as_target(ledger, "ledger"))
    async with tel.serving():
        for f in flows:
            tel.expect(f)
        run = _Run(report, stop or Stop(second="raise"), hooks or RunHooks(), tel, until_empty)
        await run.all(flows, max_seconds, copies)
    return report


class _Run:
    """One run's shared state: its report, stop, hooks, telemetry and gate."""

    def __init__(
        self, report: RunReport, stop: Stop, hooks: RunHooks, tel: Telemetry, until_empty: bool
    ) -> None:
        self.report = report
        self.stop = stop
        self.hooks = hooks
        self.tel = tel
        self.until_empty = until_empty

    async def all(
        self, flows: Sequence[Flow], max_seconds: float | None, copies: int | None
    ) -> None:
        jobs: list[tuple[Flow, Feed]] = []
        for f in flows:
            st = source_type(f)
            n = copies if copies is not None else st.copies(f.source)
            jobs.extend((f, st.open(f, self.until_empty)) for _ in range(n))
        self.gate = Gate(len(jobs))
        loop = asyncio.get_running_loop()
        deadline: list[asyncio.TimerHandle] = []
        if max_seconds is not None:

            def on_deadline() -> None:
                self.report.deadline = not self.stop.requested
                self.stop.request()

            self.gate.on_open(lambda: deadline.append(loop.call_later(max_seconds, on_deadline)))
        with self.stop.installed():
            tasks = [
                asyncio.create_task(self.one(f, feed), name=f"onceq-flow-{f.name}")
                for f, feed in jobs
            ]
            try:
                await self._wait_all(tasks)
            finally:
                for handle in deadline:
                    handle.cancel()
        stop = self.stop
        self.report.signal = stop.signals[0] if stop.signals else None
        if self.report.aborted and stop.signals:
            self.report.abort_signal = stop.signals[-1]

    async def _wait_all(self, tasks: list[asyncio.Task[None]]) -> None:
        """Every flow to its end; the first failure stops the others, then is raised.

        Before the gate (sources being checked) a failure cancels the rest: nothing has
        been consumed and no ledger opened. After it, the others stop cleanly, so what
        they hold is recorded and settled before the error is reported.
        """
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            failed = [t for t in done if not t.cancelled() and t.exception() is not None]
            if failed:
                if not self.gate.passed:
                    for t in pending:
                        t.cancel()
                self.stop.request()
                await asyncio.gather(*pending, return_exceptions=True)
                exc = failed[0].exception()
                assert exc is not None  # `failed` holds only tasks that raised
                raise exc

    async def one(self, flow: Flow, feed: Feed) -> None:
        """One consumer of `flow`: source checked, gate, ledger, consuming, its end."""
        try:
            with self.tel.flow_context(flow.name):
                await feed.check()
                await self.gate.arrive()
                if self.stop.requested:  # stopped while it started: nothing taken, no ledger
                    stats = Stats(dead_word=feed.dead_word)
                else:
                    stats = await self._consume(flow, feed)
            self.report.add(flow.name, stats, feed.report())
            if stats.misconfigured:
                # The guard's trip ends the whole run: the other flows stop cleanly.
                self.stop.request()
        finally:
            await feed.aclose()

    async def _consume(self, flow: Flow, feed: Feed) -> Stats:
        handler = flow.handler()
        target = self.report.ledger
        try:
            with open_ledger(flow, target, feed.tag) as ledger:
                if ledger.created:
                    self._ledger_created(target)
                async with feed.consuming() as transport:
                    # One Consumer for the whole run, not one per poll: the breaker's
                    # state (and the one-copy-in-flight guard) must outlive an idle moment.
                    consumer = Consumer(
                        transport,
                        ledger,
                        flow.message.decode,
                        handler or no_effect,
                        max_in_flight=feed.max_in_flight(handler is not None),
                        max_group=feed.max_group,
                        # The flow's own policies: what a transient failure leads to
                        # (the orders preset's: quarantined at once), the breaker.
                        retry=flow.retry_policy(),
                        breaker=flow.breaker_policy(),
                        guard=flow.misconfig_guard(),
                    )
                    consumer.stats.dead_word = feed.dead_word
                    for started in self.hooks.consumer:
                        started(flow.name, consumer.hooks)
                    # consumer.stop, not transport.stop: a real stop also means no new
                    # call starts for deliveries received but not yet called.
                    self.stop.add(consumer.stop, stopped=feed.stopped())
                    try:
                        async with self.tel.track(flow, consumer, transport):
                            return await feed.drive(consumer, self.stop)
                    finally:
                        self.stop.discard(consumer.stop)
        finally:
            await close_effect(handler)

    def _ledger_created(self, target: Target) -> None:
        # Whichever flow opened it first made the tables: the run's ledger is new.
        if not self.report.created:
            self.report.created = True
            for fn in self.hooks.ledger_created:
                fn(target)
