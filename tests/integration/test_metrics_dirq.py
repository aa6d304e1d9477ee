"""/metrics and /healthz of a directory-queue consumer, scraped while it runs and after.

Real processes: `onceq run FILE` (its [metrics] table) and `dirq consume --metrics-port`
(one process, and --workers 2: the children's counts reach the parent's /metrics),
with the invoice partner's hold gate making "during the run" true by construction.
The counters must equal the run's own --json summary: processed, duplicates, dead
by reason, retried.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from metrics_support import (
    Scrape,
    answers,
    expected_failures,
    expected_messages,
    healthz,
    make_invoices,
)
from mq_support import partner, wait_for
from support import free_port, open_db

# 10 files: 5 new invoices, 1 duplicate of one, 2 rejected (422), 1 BUSY (503, retried
# once by the exercise's rule, then dead), 1 not JSON. 11 settled entries (the retry
# is one), 9 calls (no call for the duplicate or the parse error).
ENTRIES, CALLS = 11, 9


def _flow_file(tmp: Path, url: str, port: int) -> Path:
    f = tmp / "flows.toml"
    f.write_text(
        f"""\
ledger = "./ledger.db"

[metrics]
port = {port}

[flows.invoices]
source = "dirq"
path = "./q"
id_field = "invoiceId"
retry = "exercise"

[flows.invoices.http]
url = "{url}/api/invoices"
"""
    )
    return f


def test_onceq_run_counts_equal_its_summary_during_and_after(tmp_path: Path) -> None:
    make_invoices(tmp_path / "q")
    port = free_port()
    with partner(kind="invoices") as p:
        p.hold()
        f = _flow_file(tmp_path, p.url, port)
        proc = subprocess.Popen(
            [sys.executable, "-m", "onceq", "run", str(f), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(lambda: answers(port) and p.held() >= 1, timeout=30)
            # During: calls wait at the partner, so they are in flight, and the queue
            # reader has counted the folders (in the background, every 5 s).
            wait_for(lambda: "inbox" in Scrape(port).by("onceq_queue_messages", "state"), 15)
            during = Scrape(port)
            assert during.value("onceq_in_flight", flow="invoices") >= 1
            states = during.by("onceq_queue_messages", "state", flow="invoices")
            assert set(states) == {"inbox", "processing", "retry", "error"}
            assert states["processing"] >= 1
            assert during.value("onceq_oldest_message_age_seconds", flow="invoices") >= 0
            assert during.settled("invoices") < ENTRIES
            assert during.types["onceq_messages"] == "counter"
            assert healthz(port) == (200, {"status": "ok", "flows": {"invoices": "ok"}})
            p.release()
            # After: everything settled, the consumer still running (it polls inbox/).
            wait_for(lambda: Scrape(port).settled("invoices") == ENTRIES, timeout=30)
            after = Scrape(port)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    summary = json.loads(out)["flows"]["invoices"]
    assert after.messages("invoices") == expected_messages(summary, "quarantined")
    assert after.failures("invoices") == expected_failures(summary)
    # The figures themselves, so that a summary and a scrape wrong alike still fail.
    assert after.failures("invoices") == {"http-422": 2, "http-503": 2, "parse": 1}
    # Dead by reason, apart from the retried attempts: the summary's own reasons.
    assert after.dead("invoices") == summary["reasons"]
    assert after.dead("invoices") == {"http-422": 2, "http-503": 1, "parse": 1}
    assert after.messages("invoices")["processed"] == 5
    assert after.messages("invoices")["duplicate"] == 1
    assert after.messages("invoices")["retried"] == 1
    # One observation per call, as many as the partner answered.
    assert after.value("onceq_effect_duration_seconds_count", flow="invoices") == CALLS
    assert after.value("onceq_breaker_open", flow="invoices") == 0
    assert after.value("onceq_flow_up", flow="invoices") == 1
    assert after.value("process_cpu_seconds_total") is not None  # the process metrics
    # Telemetry.track also started the consumer's heartbeat: its final row is in.
    with open_db(tmp_path / "ledger.db") as db:
        rows = db.execute("SELECT flow, state FROM consumers").fetchall()
    assert [(flow, json.loads(state)["status"]) for flow, state in rows] == [
        ("invoices", "stopped")
    ]


def _all_but_one_settled(p, port: int, flow: str) -> Scrape:  # type: ignore[no-untyped-def]
    """Answer held calls until every entry is settled but one (its call held)."""
    deadline = time.monotonic() + 60
    while True:
        stats = p.stats()
        held, total = stats["held"], stats["total"]
        if total == CALLS and held == 1:
            break
        keep = 1 if total == CALLS else 0
        if held > keep:
            p.release(held - keep)
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)
    # A --workers child reports every second: wait for the figures, not a fixed time.
    wait_for(lambda: Scrape(port).settled(flow) == ENTRIES - 1, timeout=30)
    return Scrape(port)


@pytest.mark.parametrize("workers", [1, 2])
def test_dirq_consume_counts_reach_metrics_and_equal_the_summary(
    tmp_path: Path, workers: int
) -> None:
    q = make_invoices(tmp_path / "q")
    port = free_port()
    with partner(kind="invoices") as p:
        p.hold()
        proc = subprocess.Popen(
            [sys.executable, "-m", "onceq", "dirq", "consume", str(q), "--id-field",
             "invoiceId", "--url", f"{p.url}/api/invoices", "--retry", "exercise", "--flow", "q",
             "--workers", str(workers), "--metrics-port", str(port), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            wait_for(lambda: answers(port) and p.held() >= 1, timeout=30)
            # The calls held at the partner are in flight in the consumer(s).
            wait_for(lambda: (Scrape(port).value("onceq_in_flight", flow="q") or 0) >= 1, 15)
            wait_for(lambda: healthz(port)[0] == 200, timeout=15)
            before = _all_but_one_settled(p, port, "q")
            p.release()
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    final_messages = expected_messages(summary, "quarantined")
    final_failures = expected_failures(summary)
    # The scrape is the final count less exactly the one entry whose call was held.
    diff = {k: final_messages[k] - before.messages("q").get(k, 0) for k in final_messages}
    assert sorted(diff.values()) == [0] * (len(diff) - 1) + [1], (diff, before.text)
    fdiff = {r: final_failures[r] - before.failures("q").get(r, 0) for r in final_failures}
    assert all(v in (0, 1) for v in fdiff.values()) and sum(fdiff.values()) <= 1, fdiff
    assert summary["received"] == ENTRIES
    assert final_failures == {"http-422": 2, "http-503": 2, "parse": 1}
    # Every call but the held one was timed, whichever child made it.
    assert before.value("onceq_effect_duration_seconds_count", flow="q") == CALLS - 1


def test_workers_parent_healthz_503_from_the_stop_signal(tmp_path: Path) -> None:
    q = make_invoices(tmp_path / "q")
    port = free_port()
    with partner(kind="invoices") as p:
        p.hold()
        proc = subprocess.Popen(
            [sys.executable, "-m", "onceq", "dirq", "consume", str(q), "--id-field",
             "invoiceId", "--url", f"{p.url}/api/invoices", "--workers", "2",
             "--metrics-port", str(port), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            wait_for(lambda: answers(port) and healthz(port)[0] == 200, timeout=30)
            wait_for(lambda: p.held() >= 1, timeout=30)
            proc.send_signal(signal.SIGTERM)
            # The children finish their held calls; the parent says it is stopping.
            wait_for(lambda: healthz(port) == (503, {"status": "stopping"}), timeout=15)
            p.release()
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 143, err  # a batch stopped before it finished
    assert json.loads(out)["stopped_by"] == "SIGTERM"
