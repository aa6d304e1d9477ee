"""The metrics' pieces: one outcome table, the histogram, the collector's text, health.

The text is parsed back with prometheus_client's own parser, as a Prometheus server
would read it.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import onceq
from metrics_support import Scrape, answers, healthz
from onceq._core.hooks import Hooks
from onceq._core.stats import COUNTS, OUTCOMES, Stats, outcome_of
from onceq._core.transport import Delivery, Kind, Settle
from onceq._ledger.sqlite import Entry
from onceq._ops.metrics import new_registry
from onceq._ops.metrics_snapshot import (
    BUCKETS,
    Durations,
    FlowMetrics,
    Snapshot,
    snapshot_dict,
    snapshot_from_dict,
)
from onceq._ops.telemetry import OpsOptions, Telemetry
from onceq._sources.amqp.depths import RabbitDepths
from onceq._sources.amqp.plugin import RabbitSource
from onceq._sources.dirq.plugin import DirSource
from support import free_port


def _entry(kind: Kind, settle: Settle, reason: str = "", **fields: Any) -> Entry:
    d = Delivery(b"{}", ref="r", msg_id="m")
    return Entry(d, kind, settle, reason, "", 1, fields)


CASES = [
    (_entry(Kind.SUCCESS, Settle.ACK), "processed", "processed"),
    (_entry(Kind.SUCCESS, Settle.ACK, partner_duplicate=True), "partner_duplicates",
     "partner_duplicate"),
    (_entry(Kind.DUPLICATE, Settle.ACK), "duplicates", "duplicate"),
    (_entry(Kind.HELD, Settle.RELEASE, "breaker-open"), "held", "held"),
    (_entry(Kind.TRANSIENT, Settle.REQUEUE, "http-503"), "requeued", "retried"),
    (_entry(Kind.TRANSIENT, Settle.DELAY, "timeout"), "requeued", "retried"),
    (_entry(Kind.TRANSIENT, Settle.DEAD, "http-503"), "dead", "dead"),
    (_entry(Kind.REJECTED, Settle.DEAD, "parse"), "dead", "dead"),
]  # fmt: skip


def test_the_outcome_table_covers_every_counted_outcome() -> None:
    assert set(OUTCOMES) == set(COUNTS) - {"received"}
    assert len(set(OUTCOMES.values())) == len(OUTCOMES)  # one word per counter


@pytest.mark.parametrize(("entry", "counter", "word"), CASES)
def test_stats_and_metrics_read_one_table(entry: Entry, counter: str, word: str) -> None:
    assert outcome_of(entry) == counter and OUTCOMES[counter] == word
    stats = Stats()
    stats.add(entry)
    assert getattr(stats, counter) == 1
    assert sum(getattr(stats, k) for k in OUTCOMES) == 1


def test_a_recovered_entry_is_recovered_whatever_its_kind() -> None:
    e = _entry(Kind.SUCCESS, Settle.ACK)
    e.recovered = True
    assert outcome_of(e) == "recovered"


def test_durations_bucket_each_value_where_prometheus_would() -> None:
    d = Durations()
    for v in (0.0, 0.005, 0.0051, 10.0, 11.0):
        d.observe(v)
    buckets = dict(d.buckets())
    assert buckets["0.005"] == 2  # le is "<=": 0.005 itself is in the 0.005 bucket
    assert buckets["0.01"] == 3
    assert buckets["10.0"] == 4
    assert buckets["+Inf"] == 5
    assert d.sum == pytest.approx(21.0101)
    again = Durations.from_dict(d.as_dict())
    again.merge(d)
    assert dict(again.buckets())["+Inf"] == 10 and len(again.counts) == len(BUCKETS) + 1


def _families(fm: FlowMetrics) -> dict[str, Any]:
    text = generate_latest(new_registry(lambda: [fm])).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_the_collector_sums_the_consumers_of_a_flow_and_names_everything() -> None:
    a, b = Stats(), Stats()
    for e, _, _ in CASES:
        a.add(e)
    b.add(CASES[0][0])
    timer = Durations()
    timer.observe(0.2)
    fm = FlowMetrics("inv")
    fm.snapshots += [
        lambda: Snapshot(a, 2, "closed", timer),
        lambda: Snapshot(b, 1, "half-open", None),
    ]
    fam = _families(fm)
    msgs = {s.labels["outcome"]: s.value for s in fam["onceq_messages"].samples}
    assert msgs == {"processed": 2, "partner_duplicate": 1, "duplicate": 1, "held": 1,
                    "retried": 2, "dead": 2, "recovered": 0}  # fmt: skip
    fails = {s.labels["reason"]: s.value for s in fam["onceq_failures"].samples}
    assert fails == {"http-503": 2, "timeout": 1, "parse": 1}  # held is no failure
    assert fam["onceq_messages"].type == "counter"
    assert [s.value for s in fam["onceq_in_flight"].samples] == [3]
    # Half-open counts as open: calls do not flow, only a probe does.
    assert [s.value for s in fam["onceq_breaker_open"].samples] == [1]
    state = {s.labels["state"]: s.value for s in fam["onceq_breaker_state"].samples}
    assert state == {"closed": 0, "open": 0, "half-open": 1}
    hist = {s.name: s.value for s in fam["onceq_effect_duration_seconds"].samples
            if s.labels.get("le") in (None, "0.25")}  # fmt: skip
    assert hist["onceq_effect_duration_seconds_count"] == 1
    assert hist["onceq_effect_duration_seconds_bucket"] == 1
    assert "process_cpu_seconds" in fam and "python_gc_collections" in fam


def test_a_flow_without_a_breaker_or_a_call_shows_neither() -> None:
    fm = FlowMetrics("rows")
    fm.snapshots.append(lambda: Snapshot(Stats()))
    fam = _families(fm)
    assert fam["onceq_breaker_open"].samples == []
    assert fam["onceq_effect_duration_seconds"].samples == []
    assert [s.value for s in fam["onceq_flow_up"].samples] == [1]


def test_two_registries_in_one_process_never_collide() -> None:
    one, two = FlowMetrics("a"), FlowMetrics("a")
    new_registry(lambda: [one])
    new_registry(lambda: [two])  # the global registry would refuse a second collector


def test_rabbit_depths_sum_the_tiers_and_add_unacked() -> None:
    from onceq._sources.amqp.depths import QueueDepth

    r = RabbitDepths.__new__(RabbitDepths)
    r.states = [("ready", "q"), ("retry", "q.5s"), ("retry", "q.30s"), ("dead", "q.dead")]
    snap = {"q": QueueDepth(7, 1, 2), "q.5s": QueueDepth(3, 0, 0), "q.30s": QueueDepth(1, 0, 0),
            "q.dead": None}  # fmt: skip
    r.cache = SimpleNamespace(snapshot=lambda: snap)
    assert r.messages() == {"ready": 7, "unacked": 2, "retry": 4}  # a missing queue: absent
    snap["q"] = QueueDepth(7, 1, None)  # the management API away: no unacked figure
    assert r.messages() == {"ready": 7, "retry": 4}


def test_a_childs_snapshot_travels_whole() -> None:
    s = Stats(dead_word="quarantined")
    for e, _, _ in CASES:
        s.add(e)
    d = Durations()
    d.observe(0.3)
    back = snapshot_from_dict(snapshot_dict(Snapshot(s, 4, "open", d, "stopping")))
    assert back.stats == s and back.stats.reasons == s.reasons
    assert (back.in_flight, back.breaker, back.problem) == (4, "open", "stopping")
    assert back.durations is not None and back.durations.counts == d.counts


def _fake_consumer(**kw: Any) -> Any:
    return SimpleNamespace(
        stats=Stats(), in_flight=0, breaker=None, stopping=False,
        holds=SimpleNamespace(ledger_away=False), hooks=Hooks(), handler=None, **kw,
    )  # fmt: skip


def test_health_names_each_flows_problem(tmp_path: Path) -> None:
    async def main() -> None:
        tel = Telemetry(OpsOptions(metrics_port=None))
        assert tel.health() == (False, {"status": "starting", "flows": {}})
        for sub in ("inbox",):
            (tmp_path / "q" / sub).mkdir(parents=True)
        dirq = SimpleNamespace(name="d", source=DirSource(tmp_path / "q"))
        mq = SimpleNamespace(name="m", source=RabbitSource("q.in"))
        c1, c2 = _fake_consumer(), _fake_consumer()
        link = SimpleNamespace(connected=True)
        tel.reporter = lambda d: None  # watch without a server
        async with tel.track(dirq, c1, None), tel.track(mq, c2, link):
            assert tel.health() == (True, {"status": "ok", "flows": {"d": "ok", "m": "ok"}})
            link.connected = False
            assert tel.health()[1]["flows"] == {"d": "ok", "m": "broker connection lost"}
            link.connected = True
            c1.holds.ledger_away = True
            assert tel.health()[1]["flows"]["d"] == "ledger unavailable"
            c1.holds.ledger_away = False
            (tmp_path / "q" / "inbox").rmdir()
            assert tel.health()[1]["flows"]["d"] == f"queue folder {tmp_path / 'q'} is gone"
            c2.stopping = True
            assert tel.health() == (
                False,
                {"status": "unavailable", "flows": {"d": f"queue folder {tmp_path / 'q'} is gone",
                                                    "m": "stopping"}},
            )  # fmt: skip
        # Both runs ended normally: done, and healthy until the process stops.
        assert tel.health() == (True, {"status": "ok", "flows": {"d": "done", "m": "done"}})
        tel.stopping()
        assert tel.health() == (False, {"status": "stopping"})

    asyncio.run(main())


def test_the_python_api_serves_metrics_for_the_run(tmp_path: Path) -> None:
    """onceq.run(..., metrics_port=P): scraped during the run, equal to what it returns."""
    gate = threading.Event()

    def effect(doc: dict[str, Any]) -> None:
        gate.wait(30)
        if doc["msg_id"] == "m-3":
            raise onceq.Reject("no")

    queue = onceq.MemoryTransport()
    for i in range(5):
        queue.publish(f'{{"msg_id": "m-{i}"}}'.encode())
    queue.publish(b'{"msg_id": "m-0"}')
    flow = onceq.Flow("api", queue, effect=effect)
    port = free_port()
    out: dict[str, Any] = {}
    runner = threading.Thread(
        target=lambda: out.update(
            onceq.run(flow, ledger=tmp_path / "l.db", until_empty=True, metrics_port=port)
        )
    )
    runner.start()
    try:
        from mq_support import wait_for

        wait_for(lambda: answers(port) and healthz(port)[0] == 200, timeout=20)
        during = Scrape(port)
        assert during.value("onceq_in_flight", flow="api") >= 1
        assert during.settled("api") == 0
    finally:
        gate.set()
        runner.join(30)
    stats = out["api"]
    assert (stats.processed, stats.duplicates, stats.dead) == (4, 1, 1)
    assert not answers(port)  # closed with the run


def test_the_python_api_refuses_a_port_in_use_before_the_ledger(tmp_path: Path) -> None:
    import socket

    queue = onceq.MemoryTransport()
    queue.publish(b'{"msg_id": "m-1"}')
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(onceq.Conflict, match=f"127.0.0.1:{port}: .*the port is in use"):
            onceq.run(onceq.Flow("api", queue), ledger=tmp_path / "l.db", metrics_port=port)
    assert not (tmp_path / "l.db").exists()
