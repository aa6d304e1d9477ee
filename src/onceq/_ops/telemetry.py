"""What a running consumer shows the outside: metrics, /healthz, JSON logs, its state.

    telemetry = Telemetry(OpsOptions(metrics_port=9464))
    telemetry.bind()                             # the port, before anything else
    async with telemetry.serving():              # /metrics and /healthz on this loop
        async with telemetry.track(flow, consumer, transport):
            await consumer.run()

One `Telemetry` per process (a process may run several flows: `onceq run`); the one
run path (onceq._flows.runner) registers each consumer it runs with `track`, so every
flow is watched the same way whichever command started it. `track` only subscribes
to the consumer's events (onceq._core.hooks: settled groups for the log lines, call
durations for the histogram, state changes for the heartbeat): it never patches it.
Importing it costs nothing either (prometheus_client and aiohttp are imported when
the server starts: `dirq lag` stays light). Without a port it serves nothing and the loop
pays for nothing: no timer, no reader (only h3's log hook, which is a level check
when INFO is off, and the heartbeat).

Where the numbers come from (onceq._ops.metrics): read at scrape time from the consumer's
own `Stats`, filled in once per settled group by the loop, so /metrics and the run's
summary cannot disagree. A --workers child has no server: it reports its snapshot to
the parent every REPORT_S seconds and at its end (`reporter`), and the parent serves
the sum (`expect_children`, `child_report`, `serving_in_thread`).

/healthz (onceq._ops.metrics_server): 200 while every flow has a consumer that is
connected — RabbitMQ: the transport's connection is up; a directory queue: its
inbox/ is there — whose ledger is not away (`Holds.ledger_away`), and the process
is not stopping; else 503 with a JSON body naming each flow's problem. It turns 503
at the first stop signal (the consumer's `stopping`) and stays so until the server
closes, after the run's final counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from onceq._core.logs import flow_context, log_group
from onceq._core.stats import Stats
from onceq._ops.metrics_port import bind_socket
from onceq._ops.metrics_queues import reader_for
from onceq._ops.metrics_snapshot import (
    Durations,
    FlowMetrics,
    Snapshot,
    healthy,
    snapshot_dict,
    snapshot_from_dict,
)
from onceq._ops.telemetry_live import Live, source_snapshot, start_heartbeat

__all__ = ["OpsOptions", "Telemetry"]

log = logging.getLogger("onceq.telemetry")  # the name in every log line: kept across moves

REPORT_S = 1.0  # how often a --workers child tells the parent its counts


@dataclass(frozen=True)
class OpsOptions:
    """How a long-running command is watched: `--metrics-port/--metrics-host/--log-format`."""

    metrics_port: int | None = None  # None: no metrics server
    metrics_host: str = "127.0.0.1"  # loopback unless the operator opens it on purpose
    log_format: str = "human"  # human | json (one JSON object a line)
    log_level: str = "warning"


class Telemetry:
    """The process's metrics registry, its /metrics + /healthz server and the flows it watches.

    `reporter`: a --workers child's way to the parent (called with a snapshot dict).
    """

    def __init__(
        self,
        opts: OpsOptions | None = None,
        *,
        reporter: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.opts = opts or OpsOptions()
        self.reporter = reporter
        self.flows: dict[str, FlowMetrics] = {}
        self._stopping = False
        self._sock: Any = None
        self._server: Any = None  # onceq._ops.metrics_server.MetricsServer
        self._readers: list[Any] = []  # queue readers not yet started
        self._tasks: list[asyncio.Task[None]] = []
        self._halt: asyncio.Event | None = None  # stops the queue readers
        self._slots: list[Snapshot] = []  # the --workers children's last reports

    @property
    def enabled(self) -> bool:
        """A port was given: metrics are kept and served."""
        return self.opts.metrics_port is not None

    @property
    def watching(self) -> bool:
        return self.enabled or self.reporter is not None

    # --- the server -------------------------------------------------------------------

    def bind(self) -> None:
        """Take the port now (idempotent): Conflict (exit 4) when it is in use.

        Called by each command before it checks the queue or opens the ledger, so a
        refused port leaves nothing consumed and no ledger created.
        """
        if self.enabled and self._sock is None:
            assert self.opts.metrics_port is not None
            self._sock = bind_socket(self.opts.metrics_host, self.opts.metrics_port)

    def close_inherited(self) -> None:
        """In a forked --workers child: drop the parent's listening socket (no server here)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def start(self) -> None:
        """Serve /metrics and /healthz on the running loop (when a port is set); idempotent."""
        if not self.enabled or self._server is not None:
            return
        # why: aiohttp and prometheus_client load only when a port is served (start-up)
        from onceq._ops.metrics_server import MetricsServer

        self.bind()
        self._halt = asyncio.Event()
        server = MetricsServer(lambda: self.flows.values(), self.health)
        await server.start(self._sock)
        self._server = server
        for reader in self._readers:
            self._start_reader(reader)
        self._readers.clear()

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[Telemetry]:
        """Serve while inside; closed after the body (the run's final counts) is done."""
        await self.start()
        try:
            yield self
        finally:
            await self.aclose()

    def stopping(self) -> None:
        """The process is stopping: /healthz answers 503 from now on."""
        self._stopping = True

    async def aclose(self) -> None:
        """Stop the queue readers and the server."""
        self._stopping = True
        if self._halt is not None:
            self._halt.set()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2.0)
            for t in self._tasks:
                t.cancel()
            self._tasks.clear()
        try:
            if self._server is not None:
                server, self._server = self._server, None
                await server.aclose()
        except Exception as exc:
            # An observer's failure at the end must not replace the run's own result
            # (an --until-empty batch that finished would exit non-zero).
            log.warning(
                "closing the metrics server failed: %s",
                exc,
                extra={"event": "telemetry-close-failed"},
            )
        finally:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def health(self) -> tuple[bool, dict[str, Any]]:
        """/healthz's answer: (healthy, body)."""
        if self._stopping:
            return False, {"status": "stopping"}
        if not self.flows:
            return False, {"status": "starting", "flows": {}}
        flows = {name: fm.total().problem for name, fm in self.flows.items()}
        ok = all(healthy(p) for p in flows.values())
        return ok, {
            "status": "ok" if ok else "unavailable",
            "flows": {n: p or "ok" for n, p in flows.items()},
        }

    # --- the flows --------------------------------------------------------------------

    def expect(self, flow: Any) -> FlowMetrics:
        """A flow this process will run: shown (as starting) before its consumer is up."""
        fm = self.flows.get(flow.name)
        if fm is None:
            fm = self.flows[flow.name] = FlowMetrics(flow.name)
        return fm

    @contextlib.asynccontextmanager
    async def track(self, flow: Any, consumer: Any, transport: Any) -> AsyncIterator[None]:
        """Watch one flow's consumer while inside (metrics, health, published state)."""
        hooks = consumer.hooks
        hooks.settled.append(functools.partial(_log_settled, flow.name, log_group))
        watch = Live(flow, consumer, transport)
        reporter = None
        if self.watching:
            # why: core.outcome loads sqlite3 (core.values): not for `dirq lag`'s start-up
            from onceq._core.outcome import no_effect

            if consumer.handler is not no_effect:
                watch.durations = Durations()
                hooks.call_ended.append(watch.durations.observe)
            fm = self.expect(flow)
            fm.snapshots.append(watch.snapshot)
            if self.enabled and fm.queue is None:
                fm.queue = reader_for(flow, transport)
                if fm.queue is not None:
                    self._start_reader(fm.queue)
            if self.reporter is not None:
                reporter = asyncio.create_task(self._report_loop(watch), name="onceq-report")
        # The consumer's row in the ledger's `consumers` table (onceq._ops.heartbeat), what
        # `onceq status` shows of a running consumer; it notices a breaker change by
        # itself within a second, and its final row says "stopped".
        heartbeat = await start_heartbeat(consumer, transport)
        if heartbeat is not None:
            # The guard's trip is published at once. A stop is not poked: every consumer
            # of a --workers run stops at the same instant, beside its final commits, and
            # their pokes would meet on the write lock; its 1 s check sees it anyway.
            hooks.state.append(lambda what: heartbeat.poke() if what == "misconfigured" else None)
        try:
            yield
        finally:
            watch.ended = True
            if reporter is not None:
                reporter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reporter
                self._report(watch)  # the final counts, before the child's result
            if heartbeat is not None:
                try:
                    await heartbeat.aclose()
                except Exception as exc:  # the run's result stands, whatever its observer did
                    log.warning(
                        "closing the heartbeat failed: %s",
                        exc,
                        extra={"event": "telemetry-close-failed"},
                    )

    def flow_context(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """The log context of one flow: every record logged inside names it."""
        return flow_context(name)

    def _start_reader(self, reader: Any) -> None:
        if self._halt is None:  # not serving yet: started with the server
            self._readers.append(reader)
            return
        task = asyncio.get_running_loop().create_task(reader.run(self._halt))
        task.add_done_callback(_log_reader_failure)
        self._tasks.append(task)

    # --- --workers: children report, the parent serves ----------------------------------

    async def _report_loop(self, watch: Live) -> None:
        while True:
            self._report(watch)
            await asyncio.sleep(REPORT_S)

    def _report(self, watch: Live) -> None:
        assert self.reporter is not None
        try:
            self.reporter(snapshot_dict(watch.snapshot()))
        except Exception:  # a parent gone away must not end the child's run
            log.debug(
                "could not report to the parent", exc_info=True, extra={"event": "report-failed"}
            )

    def expect_children(self, flow: Any, n: int) -> None:
        """The --workers parent: n children's slots, and the queue reader it runs itself."""
        fm = self.expect(flow)
        self._slots = [Snapshot(Stats(), problem="starting") for _ in range(n)]
        for i in range(n):
            fm.snapshots.append(functools.partial(self._slot, i))
        fm.snapshots.append(lambda: source_snapshot(flow))
        if self.enabled:
            fm.queue = reader_for(flow, None)
            self._start_reader(fm.queue)

    def _slot(self, i: int) -> Snapshot:
        """Child i's latest snapshot, read when /metrics is scraped."""
        return self._slots[i]

    def child_report(self, i: int, d: dict[str, Any]) -> None:
        """Child i's latest snapshot, replaced whole (one assignment: the server thread-safe)."""
        self._slots[i] = snapshot_from_dict(d)

    @contextlib.contextmanager
    def serving_in_thread(self) -> Iterator[None]:
        """Serve from a thread with a loop of its own while inside (the --workers parent).

        Started after the children are forked: a fork copies only the forking thread,
        and a child must not inherit a server thread's locks half-held.
        """
        if not self.enabled:
            yield
            return
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failed: list[BaseException] = []

        def main() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start())
            except BaseException as exc:
                failed.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()

        thread = threading.Thread(target=main, name="onceq-metrics", daemon=True)
        thread.start()
        ready.wait()
        if failed:
            raise failed[0]
        try:
            yield
        finally:
            asyncio.run_coroutine_threadsafe(self.aclose(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()


def _log_settled(flow: str, log_group: Callable[..., None], group: Sequence[Any]) -> None:
    # Runs in the committer, after the settle: a log line that fails (a closed stderr,
    # a handler's bug) must not end the run — the committer's errors do.
    with contextlib.suppress(Exception):
        log_group(flow, group)


def _log_reader_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        # A queue reader is an observer: its failure costs the depth figures, never the run.
        log.warning(
            "queue depth reader stopped: %s",
            task.exception(),
            extra={"event": "depth-reader-stopped"},
        )
