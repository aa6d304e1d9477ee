"""Run flows: several in one process and one asyncio loop, one ledger, one stop.

    onceq.run(flow_a, flow_b, ledger="ledger.db", until_empty=True)  ->  {name: Stats}
    onceq.run(flow_a, ledger="postgresql://onceq:PW@db:5432/app")   # a shared ledger

Each flow gets its own ledger object on the same ledger (an SQLite file: its write
lock and `BEGIN IMMEDIATE` serialise their commits; a PostgreSQL database: one
connection each; dedup is per flow, so two flows never refuse each other's ids).
The per-source work is the code `dirq consume` and `mq consume` run
(`onceq.sources.dirq.run.consume_flow`, `onceq.sources.amqp.consume.consume_flow`): there is no
second consume path for flow files or the Python API.

Order of a start, as in `mq consume`: every source is checked first (the queue
folder exists, the broker has the queue), then the ledger is opened, then consuming
starts; so a refused run leaves no ledger file and consumes nothing.

Stopping is one decision for all flows: the first SIGINT/SIGTERM (or `max_seconds`)
stops every flow cleanly (nothing new is taken; what is held is recorded and
settled); a second signal stops the process at once, which is as safe as a kill -9
(unsettled copies come back: the broker requeues them, the next run of a directory
queue recovers its claims).

The per-flow ends combine into one (`onceq run`'s exit code): a flow whose
misconfiguration guard trips stops the whole run like any flow's error
(`Misconfigured`, 10: the others stop cleanly first); otherwise a signal or the
deadline before a batch finished (130/143, 1); otherwise, for a batch
(`until_empty`), `AllFailed` (11) when any flow received messages and every one of
them failed (`all_failed_error`); otherwise 0.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceq.core.stop import STOP_SIGNALS, Stop
from onceq.errors import OnceqError, UsageError
from onceq.ledger.target import Target, as_target, describe

__all__ = ["POLL_SECONDS", "STOP_SIGNALS", "Gate", "RunReport", "Stop", "run", "run_async"]

if TYPE_CHECKING:
    from onceq.core.consumer import Stats
    from onceq.flows.flow import Flow
    from onceq.ledger.sqlite import Entry
    from onceq.ops.telemetry import Telemetry

POLL_SECONDS = 0.5  # a directory queue has no push: an idle inbox is looked at this often


class Gate:
    """Every source checked before any ledger is opened: a refused run creates nothing."""

    def __init__(self, parties: int) -> None:
        self._left = parties
        self._open = asyncio.Event()
        if parties <= 0:
            self._open.set()

    async def arrive(self) -> None:
        self._left -= 1
        if self._left <= 0:
            self._open.set()
        await self._open.wait()

    @property
    def passed(self) -> bool:
        return self._open.is_set()


@dataclass
class RunReport:
    """What a run of several flows did; `finished` says a batch emptied every source."""

    ledger: Target  # a path or a postgresql:// URL (shown by `describe`: no password)
    stats: dict[str, Stats] = field(default_factory=dict)
    drained: dict[str, bool] = field(default_factory=dict)  # rabbitmq flows
    unsettled: dict[str, int] = field(default_factory=dict)  # rabbitmq flows
    signal: int | None = None
    deadline: bool = False
    created: bool = False  # this run made the ledger's tables (it had seen nothing)

    @property
    def finished(self) -> bool:
        return self.signal is None and not self.deadline and all(self.drained.values())

    def as_dict(self) -> dict[str, Any]:
        flows = {}
        for name, stats in self.stats.items():
            d = stats.as_dict()
            if name in self.drained:
                d["drained"] = self.drained[name]
                d["unsettled"] = self.unsettled[name]
            flows[name] = d
        return {"ledger": describe(self.ledger), "flows": flows, "finished": self.finished}


def check_flows(flows: Sequence[Flow]) -> list[Flow]:
    """Each flow valid and named once (two flows of one name would share their dedup)."""
    from onceq.flows.flow import Flow

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
    return asyncio.run(
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
    from onceq.ops.telemetry import OpsOptions, Telemetry

    telemetry = Telemetry(OpsOptions(metrics_port=metrics_port, metrics_host=metrics_host))
    report = await run_flows(
        flows, ledger, until_empty=until_empty, max_seconds=max_seconds, telemetry=telemetry
    )
    if until_empty and report.finished:
        error = all_failed_error(report, flows)
        if error is not None:
            raise error
    return report.stats


def all_failed_error(report: RunReport, flows: Sequence[Flow]) -> OnceqError | None:
    """AllFailed (11) naming each flow of a finished batch whose every message failed."""
    from onceq.core.misconfig import run_error
    from onceq.errors import AllFailed

    lines = []
    for f in flows:
        stats = report.stats.get(f.name)
        if stats is not None:
            error = run_error(f.guard_policy(), stats, batch=True, where=f"flow {f.name}")
            if error is not None:
                lines.append(str(error))
    return AllFailed("; ".join(lines), report.stats) if lines else None


async def run_flows(
    flows: Sequence[Flow],
    ledger: str | Path,
    *,
    until_empty: bool = False,
    max_seconds: float | None = None,
    on_settled: Callable[[str, Sequence[Entry]], None] | None = None,
    telemetry: Telemetry | None = None,
) -> RunReport:
    """Run `flows` side by side; what `onceq run` and `onceq.run` share.

    `telemetry` serves /metrics and /healthz from before any source is checked until
    every flow's final counts are in.
    """
    from onceq.ops.telemetry import Telemetry

    tel = telemetry or Telemetry()
    flows = check_flows(flows)
    tel.bind()  # before any source or ledger: a port in use touches nothing
    async with tel.serving():
        for f in flows:
            tel.expect(f)
        return await _run_flows(flows, ledger, until_empty, max_seconds, on_settled, tel)


async def _run_flows(
    flows: Sequence[Flow],
    ledger: str | Path,
    until_empty: bool,
    max_seconds: float | None,
    on_settled: Callable[[str, Sequence[Entry]], None] | None,
    tel: Telemetry,
) -> RunReport:
    from onceq.core.consumer import Stats

    if max_seconds is not None and not max_seconds > 0:
        raise UsageError(f"max_seconds must be a positive number, not {max_seconds}")
    # Checked before any source: a mistyped URL is refused (exit 2) with nothing touched.
    # A URL stays a str: Path() would fold its `//`.
    report = RunReport(as_target(ledger, "ledger"))
    stop = Stop(second="raise")
    jobs: list[tuple[Flow, Any]] = []
    for f in flows:
        copies = f.source.workers if f.kind == "dirq" else 1
        jobs.extend((f, None) for _ in range(copies))
    gate = Gate(len(jobs))
    loop = asyncio.get_running_loop()
    with stop.installed():
        deadline = None
        if max_seconds is not None:

            def on_deadline() -> None:
                report.deadline = not stop.requested
                stop.request()

            deadline = loop.call_later(max_seconds, on_deadline)
        tasks = [
            asyncio.create_task(
                _run_one(f, report, stop, gate, until_empty, on_settled, tel),
                name=f"onceq-flow-{f.name}",
            )
            for f, _ in jobs
        ]
        try:
            results = await _wait_all(tasks, stop, gate)
        finally:
            if deadline is not None:
                deadline.cancel()
    for (f, _), result in zip(jobs, results, strict=True):
        stats = report.stats.setdefault(f.name, Stats(dead_word=result["stats"].dead_word))
        stats.merge(result["stats"].as_dict())
        if "drained" in result:
            report.drained[f.name] = result["drained"]
            report.unsettled[f.name] = result["unsettled"]
    report.signal = stop.signals[0] if stop.signals else None
    return report


async def _wait_all(tasks: list[asyncio.Task[Any]], stop: Stop, gate: Gate) -> list[Any]:
    """Every flow's result; the first failure stops the others, then is raised.

    Before the gate (sources being checked) a failure cancels the rest: nothing has
    been consumed and no ledger opened. After it, the others stop cleanly, so what
    they hold is recorded and settled before the error is reported.
    """
    pending = set(tasks)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
        failed = [t for t in done if not t.cancelled() and t.exception() is not None]
        if failed:
            if not gate.passed:
                for t in pending:
                    t.cancel()
            stop.request()
            await asyncio.gather(*pending, return_exceptions=True)
            exc = failed[0].exception()
            assert exc is not None  # `failed` holds only tasks that raised
            raise exc
    return [t.result() for t in tasks]


async def _run_one(
    flow: Flow,
    report: RunReport,
    stop: Stop,
    gate: Gate,
    until_empty: bool,
    on_settled: Callable[[str, Sequence[Entry]], None] | None,
    tel: Telemetry,
) -> dict[str, Any]:
    settled = None if on_settled is None else (lambda group: on_settled(flow.name, group))
    ledger = report.ledger

    def on_new_ledger(_: object) -> None:
        # Whichever flow opened it first made the tables: the run's ledger is new.
        report.created = True

    if flow.kind == "rabbitmq":
        from onceq.sources.amqp.consume import ConsumeOptions, consume_flow

        opts = ConsumeOptions(db=ledger, until_empty=until_empty, timeout=_timeout(flow))
        result = await consume_flow(
            flow,
            opts,
            on_settled=settled,
            on_new_ledger=on_new_ledger,
            stop=stop,
            before_ledger=gate.arrive,
            telemetry=tel,
        )
        _guard_stopped(flow, result.stats)
        return {
            "stats": result.stats,
            "drained": bool(result.drained),
            "unsettled": result.unsettled,
        }
    if flow.kind == "transport":
        with tel.flow_context(flow.name):
            stats = await _run_transport(flow, report, stop, gate, settled, tel)
            _guard_stopped(flow, stats)
            return {"stats": stats}
    from onceq.sources.dirq.run import consume_flow as consume_dir

    stats = await consume_dir(
        flow,
        ledger,
        stop=stop,
        until_empty=until_empty,
        on_settled=settled,
        before_ledger=gate.arrive,
        on_new_ledger=on_new_ledger,
        telemetry=tel,
    )
    _guard_stopped(flow, stats)
    return {"stats": stats}


def _guard_stopped(flow: Flow, stats: Stats) -> None:
    """A flow whose guard tripped ends the run as an error (Misconfigured, exit 10)."""
    from onceq.core.misconfig import stopped_error

    if stats.misconfigured:
        raise stopped_error(stats, f"flow {flow.name}")


async def _run_transport(
    flow: Flow,
    report: RunReport,
    stop: Stop,
    gate: Gate,
    on_settled: Callable[[Sequence[Entry]], None] | None,
    tel: Telemetry,
) -> Stats:
    """A flow over a Transport instance (a MemoryTransport in a user's tests)."""
    from onceq.core.consumer import Consumer, no_effect
    from onceq.flows.flow import close_effect, open_ledger

    await gate.arrive()
    handler = flow.handler()
    try:
        with open_ledger(flow, report.ledger, "memory") as book:
            if book.created:
                report.created = True
            # The flow's own policies (the Python API's defaults: 1 immediate retry and
            # the delayed tiers, the breaker on with a call effect), as every transport.
            consumer = Consumer(
                flow.source,
                book,
                flow.message.decode,
                handler or no_effect,
                on_settled=on_settled,
                retry=flow.retry_policy(),
                breaker=flow.breaker_policy(),
                guard=flow.misconfig_guard(),
            )
            stop.add(consumer.stop)
            try:
                async with tel.track(flow, consumer, flow.source):
                    return await consumer.run()
            finally:
                stop.discard(consumer.stop)
    finally:
        await close_effect(handler)


def _timeout(flow: Flow) -> float:
    """The effect's per-call timeout: what a clean stop must wait for at most."""
    value = getattr(flow.effect, "timeout", None)
    return float(value) if isinstance(value, int | float) else 10.0
