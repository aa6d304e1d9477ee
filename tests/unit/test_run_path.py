"""The one run path: the loop's hooks, the run's hooks, and the one rule from a run's
report to the error (and exit code) it ends with."""

from __future__ import annotations

import asyncio
import io
import json
import signal
from pathlib import Path
from typing import Any

import pytest

import onceq
from onceq._cli.progress import StatusLine
from onceq._core.consumer import Consumer, Outcome
from onceq._core.hooks import Hooks, RunHooks
from onceq._core.stats import Stats
from onceq._core.transport import Delivery, Kind
from onceq._flows.flow import Flow
from onceq._flows.run_end import RunReport, Stopped, run_error
from onceq._flows.runner import run_flows
from onceq._ledger.sqlite import Ledger
from onceq._sources import registry
from onceq._sources.amqp.plugin import RabbitSource
from onceq._sources.dirq.plugin import DirSource
from onceq._sources.feed import Feed
from onceq._sources.memory import MemoryTransport
from onceq.errors import AllFailed, Misconfigured


def decode(d: Delivery) -> Outcome:
    d.msg_id = json.loads(d.body)["id"]
    return Outcome(Kind.SUCCESS)


async def ok(d: Delivery, fields: dict[str, Any]) -> Outcome:
    return Outcome(Kind.SUCCESS)


def _transport(n: int) -> MemoryTransport:
    t = MemoryTransport()
    for i in range(n):
        t.publish(json.dumps({"id": f"m{i}"}).encode())
    return t


def test_the_loop_tells_its_subscribers_and_costs_an_empty_list_otherwise(tmp_path: Path) -> None:
    groups: list[int] = []
    calls: list[float] = []
    states: list[str] = []

    async def main() -> None:
        with Ledger(tmp_path / "q.db") as ledger:
            quiet = Consumer(_transport(3), ledger, decode, ok)
            assert (quiet.hooks.settled, quiet.hooks.call_ended, quiet.hooks.state) == ([], [], [])
            await quiet.run()  # nobody listens: nothing to call
        with Ledger(tmp_path / "l.db") as ledger:
            c = Consumer(_transport(5), ledger, decode, ok, max_group=2)
            c.hooks.settled.append(lambda g: groups.append(len(g)))
            c.hooks.call_ended.append(calls.append)
            c.hooks.state.append(states.append)
            await c.run()
            c.stop()

    asyncio.run(main())
    assert sum(groups) == 5 and max(groups) <= 2  # one event per group, after its settle
    assert len(calls) == 5 and all(s >= 0 for s in calls)  # one per call
    assert states == ["stopping"]


def test_on_settled_is_a_subscriber_of_the_settled_groups(tmp_path: Path) -> None:
    seen: list[int] = []

    async def main() -> None:
        with Ledger(tmp_path / "l.db") as ledger:
            c = Consumer(_transport(4), ledger, decode, on_settled=lambda g: seen.append(len(g)))
            assert c.hooks.settled
            await c.run()

    asyncio.run(main())
    assert sum(seen) == 4


def test_the_run_tells_each_consumer_and_a_new_ledger(tmp_path: Path) -> None:
    hooks = RunHooks()
    started: list[str] = []
    made: list[Any] = []
    settled: list[int] = []

    def consumer(name: str, h: Hooks) -> None:
        started.append(name)
        h.settled.append(lambda g: settled.append(len(g)))

    hooks.consumer.append(consumer)
    hooks.ledger_created.append(made.append)
    flows = [Flow("a", _transport(3)), Flow("b", _transport(2))]
    report = asyncio.run(run_flows(flows, tmp_path / "l.db", until_empty=True, hooks=hooks))
    assert sorted(started) == ["a", "b"] and sum(settled) == 5
    assert made == [tmp_path / "l.db"] and report.created  # said once, by the first flow
    again = asyncio.run(run_flows([Flow("a", _transport(1))], tmp_path / "l.db", until_empty=True))
    assert not again.created


def test_each_kind_of_source_is_opened_by_its_type(tmp_path: Path) -> None:
    t = MemoryTransport()
    d = Flow("d", DirSource(tmp_path))
    assert type(registry.of(d.source).open(d, True)).__name__ == "DirFeed"
    rabbit = Flow("r", RabbitSource("x.in"))
    assert type(registry.of(rabbit.source).open(rabbit, False)).__name__ == "RabbitFeed"
    feed = registry.of(t).open(Flow("t", t), True)
    assert type(feed) is Feed and feed.transport is t
    assert registry.of(DirSource(tmp_path, workers=3)).copies(DirSource(tmp_path, workers=3)) == 3


def _report(**kw: Any) -> tuple[RunReport, list[Flow]]:
    flow = Flow("f", MemoryTransport())
    stats = Stats()
    for k, v in kw.pop("stats", {}).items():
        setattr(stats, k, v)
    report = RunReport(Path("l.db"), stats={"f": stats}, **kw)
    return report, [flow]


def _words(name: str | None, aborted: bool) -> str:
    return f"stopped:{name}:{aborted}"


def _end(report: RunReport, flows: list[Flow], batch: bool = True) -> Any:
    return run_error(report, flows, batch=batch, where=lambda f: f.name, unfinished=_words)


def test_one_rule_maps_every_run_end() -> None:
    # The guard's trip comes first, whatever else happened.
    r, flows = _report(stats={"misconfigured": "hint", "received": 10, "dead": 10},
                       signal=signal.SIGTERM)  # fmt: skip
    assert isinstance(_end(r, flows), Misconfigured)
    # A batch a signal stopped first: 128 + the signal; the deadline: 1.
    r, flows = _report(signal=signal.SIGTERM)
    e = _end(r, flows)
    assert isinstance(e, Stopped) and e.exit_code == 143 and str(e) == "stopped:SIGTERM:False"
    r, flows = _report(deadline=True)
    assert _end(r, flows).exit_code == 1
    r, flows = _report(drained={"f": False})
    assert _end(r, flows).exit_code == 1
    # A service stopped by a signal ends well; one whose grace a second signal cut: 130.
    r, flows = _report(signal=signal.SIGTERM)
    assert _end(r, flows, batch=False) is None
    r, flows = _report(signal=signal.SIGTERM, aborted=True, abort_signal=signal.SIGINT)
    e = _end(r, flows, batch=False)
    assert e.exit_code == 130 and str(e) == "stopped:SIGINT:True"
    # A finished batch that only failed: 11 (not under the exercise's rule).
    r, flows = _report(stats={"received": 2, "dead": 2})
    assert isinstance(_end(r, flows), AllFailed)
    assert _end(r, flows, batch=False) is None
    # The Python API: no words for a stop, so a stop is no error.
    r, flows = _report(signal=signal.SIGINT, stats={"received": 2, "dead": 2})
    assert run_error(r, flows, batch=True, where=lambda f: f.name) is None


def test_the_progress_line_shows_only_once_a_consumer_starts() -> None:
    stream = io.StringIO()
    line = StatusLine("q", "quarantined", stream)
    line.stop()  # no consumer started: nothing drawn, nothing erased
    assert stream.getvalue() == ""
    hooks = Hooks()
    line.consumer("q", hooks)
    assert hooks.settled == [line.settled] and "settled" in stream.getvalue()
    line.stop()


def test_the_api_still_raises_misconfigured_through_the_one_path(tmp_path: Path) -> None:
    t = MemoryTransport()
    for i in range(12):
        t.publish(json.dumps({"other": i}).encode())
    flow = onceq.Flow("inv", t, onceq.MessageSpec(id_field="invoice_id"))
    with pytest.raises(Misconfigured, match="flow inv: misconfigured"):
        onceq.run(flow, ledger=tmp_path / "l.db", until_empty=True)
