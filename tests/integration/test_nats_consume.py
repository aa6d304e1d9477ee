"""`onceq nats consume`, `onceq run` and `onceq.run` over the real server and partner stub.

The invoice example end to end: done → ack after the ledger; a re-sent id → ack without
a call; a rejection → a stored dead letter with its reason, then the ack; a transient
failure → NAK (at once), NAK with the tier's delay, then dead; the batch ends once the
durable consumer has nothing pending or unacked; a graceful stop leaves nothing lost
and calls nothing twice.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from mq_support import EXERCISE, partner, wait_for
from nats_support import (  # noqa: F401
    Names,
    consumer_state,
    dead_letters,
    nats_names_fixture,
    publish,
    setup,
)
from support import SAMPLE, free_port, run_cli

INVOICES = SAMPLE / "invoices"


def body(name: str) -> bytes:
    return (INVOICES / name).read_bytes()


WINDOW = 1.0  # the test streams' duplicate window (2 min by default), so a copy can miss it


def publish_invoices(names: Names) -> None:
    """inv-001 … inv-007, each with its id as Nats-Msg-Id; the re-sent INV-1 after the
    stream's duplicate window, so the stream keeps it and the ledger meets it."""
    paths = sorted(INVOICES.glob("inv-00[1-7]*.json"))
    items = {
        p.name: (p.read_bytes(), {"Nats-Msg-Id": json.loads(p.read_bytes())["invoiceId"]})
        for p in paths
    }
    late = items.pop("inv-004-resent-001.json")
    assert not any(ack.duplicate for ack in publish(names, list(items.values())))
    time.sleep(2 * WINDOW + 0.5)  # the server purges its id map by a timer of one window
    assert not publish(names, [late])[0].duplicate


def consume(names: Names, url: str, db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(
        "nats", "consume", "--stream", names.stream, "--durable", names.durable,
        "--id-field", "invoiceId", "--url", f"{url}/api/invoices", "--db", str(db), "--json",
        *args, env={"ONCEQ_NATS_URL": names.url}, timeout=120,
    )  # fmt: skip


def rows(db: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def test_the_invoice_example_with_flags(nats_names: Names, tmp_path: Path) -> None:
    setup(nats_names, duplicate_window=WINDOW)
    publish_invoices(nats_names)
    db = tmp_path / "ledger.db"
    with partner(kind="invoices") as p:
        r = consume(nats_names, p.url, db, "--until-empty", *EXERCISE)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        # INV-6 (BUSY, 503) is tried, NAKed, tried again, dead; the late INV-1 copy is
        # the ledger's duplicate: no call.
        assert (out["processed"], out["duplicates"], out["dead"]) == (4, 1, 2), out
        assert out["requeued_reasons"] == {"http-503": 1}
        assert out["reasons"] == {"http-422": 1, "http-503": 1}
        assert out["drained"] is True and out["unsettled"] == 0
        calls = p.stats()["by_id"]
        assert calls["INV-6"] == 2 and calls["INV-1"] == 1
    state = consumer_state(nats_names)
    assert state == {"pending": 0, "ack_pending": 0, "redelivering": 0, "stored": 0, "dead": 2}
    dead = dead_letters(nats_names)
    reasons = sorted(h["Onceq-Dead-Reason"] for _, h in dead)
    assert reasons == ["http-422", "http-503"]
    assert {h["Onceq-Msg-Id"] for _, h in dead} == {"INV-5", "INV-6"}
    assert {b for b, _ in dead} == {body("inv-005-negative.json"), body("inv-006-busy.json")}
    assert rows(db, "SELECT count(*) FROM messages WHERE source = 'nats'") == [(4,)]


def test_a_delayed_tier_is_a_nak_with_its_delay_and_the_batch_waits_for_it(
    nats_names: Names, tmp_path: Path
) -> None:
    setup(nats_names)
    publish(nats_names, [(body("inv-006-busy.json"), {"Nats-Msg-Id": "INV-6"})])
    db = tmp_path / "ledger.db"
    with partner(kind="invoices") as p:
        started = time.monotonic()
        r = consume(
            nats_names, p.url, db, "--until-empty", "--immediate-retries", "0",
            "--retry-delays", "2s", "--no-breaker",
        )  # fmt: skip
        took = time.monotonic() - started
        assert r.returncode == 11, r.stderr  # its only message failed
        out = json.loads(r.stdout)
        assert out["dead"] == 1 and out["drained"] is True
        assert p.stats()["by_id"]["INV-6"] == 2  # the try, then the 2 s tier's
    assert took >= 2.0
    failures = rows(db, "SELECT action FROM failures ORDER BY attempt")
    assert [a for (a,) in failures] == ["delay", "dead"]
    assert consumer_state(nats_names)["dead"] == 1


def test_a_graceful_stop_loses_nothing_and_calls_nothing_twice(
    nats_names: Names, tmp_path: Path
) -> None:
    setup(nats_names)
    docs = [{"invoiceId": f"S-{i}", "customer": "ACME", "total": 10} for i in range(30)]
    publish(nats_names, [(json.dumps(d).encode(), {"Nats-Msg-Id": d["invoiceId"]}) for d in docs])
    db = tmp_path / "ledger.db"
    with partner(delay=0.2, kind="invoices") as p:
        env = {**os.environ, "ONCEQ_NATS_URL": nats_names.url}
        args = [
            "--stream", nats_names.stream, "--durable", nats_names.durable, "--id-field",
            "invoiceId", "--url", f"{p.url}/api/invoices", "--db", str(db), "--json",
        ]  # fmt: skip
        proc = subprocess.Popen(
            [sys.executable, "-m", "onceq", "nats", "consume", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        try:
            wait_for(lambda: p.stats()["total"] >= 5, 30)
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err
        first = json.loads(out)
        assert first["processed"] >= 5 and first["unsettled"] == 0
        # Whatever the stop left is still the stream's: a second run finishes it.
        r = consume(nats_names, p.url, db, "--until-empty")
        assert r.returncode == 0, r.stderr
        second = json.loads(r.stdout)
        assert first["processed"] + second["processed"] == 30
        assert set(p.stats()["by_id"].values()) == {1}  # nobody called twice
    assert consumer_state(nats_names)["stored"] == 0


def test_a_flow_file_and_the_python_api(nats_names: Names, tmp_path: Path) -> None:
    setup(nats_names, duplicate_window=WINDOW)
    publish_invoices(nats_names)
    flows = tmp_path / "flows.toml"
    with partner(kind="invoices") as p:
        flows.write_text(
            'ledger = "./flows.db"\n[flows.invoices]\nsource = "nats"\n'
            f'stream = "{nats_names.stream}"\ndurable = "{nats_names.durable}"\n'
            'id_field = "invoiceId"\nretry = "exercise"\nbreaker = false\n'
            f'[flows.invoices.http]\nurl = "{p.url}/api/invoices"\n'
        )
        r = run_cli(
            "run", str(flows), "--until-empty", "--json",
            env={"ONCEQ_NATS_URL": nats_names.url}, timeout=120,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)["flows"]["invoices"]
        assert (out["processed"], out["duplicates"], out["dead"]) == (4, 1, 2), out
        # Python: the same flow, against the (now empty) consumer plus one new invoice.
        publish(nats_names, [(b'{"invoiceId": "PY-1", "total": 3}', {"Nats-Msg-Id": "PY-1"})])
        code = (
            "import onceq, sys\n"
            f"flow = onceq.Flow('invoices', onceq.NatsSource({nats_names.stream!r},"
            f" {nats_names.durable!r}), onceq.MessageSpec(id_field='invoiceId',"
            f" id_property=True), onceq.HttpEffect({p.url + '/api/invoices'!r}))\n"
            f"stats = onceq.run(flow, ledger={str(tmp_path / 'flows.db')!r}, until_empty=True)\n"
            "print(stats['invoices'].processed, stats['invoices'].duplicates)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
            env={**os.environ, "ONCEQ_NATS_URL": nats_names.url},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["1", "0"]
        assert p.stats()["by_id"]["PY-1"] == 1


def test_a_call_longer_than_the_ack_wait_is_kept_with_in_progress_acks(
    nats_names: Names, tmp_path: Path
) -> None:
    # AckWait 2 s, calls of 3 s: without +WPI the server would redeliver each copy
    # while its call is still running.
    setup(nats_names, ack_wait=2.0)
    docs = [{"invoiceId": f"L-{i}", "total": 1} for i in range(3)]
    publish(nats_names, [(json.dumps(d).encode(), {"Nats-Msg-Id": d["invoiceId"]}) for d in docs])
    with partner(delay=3.0, kind="invoices") as p:
        r = consume(nats_names, p.url, tmp_path / "l.db", "--until-empty", "--prefetch", "3")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert (out["received"], out["processed"], out["duplicates"]) == (3, 3, 0), out
        assert p.stats()["by_id"] == {d["invoiceId"]: 1 for d in docs}


def test_metrics_show_the_consumer_s_depths(nats_names: Names, tmp_path: Path) -> None:
    from metrics_support import Scrape, answers

    setup(nats_names)
    docs = [{"invoiceId": f"M-{i}", "total": 1} for i in range(10)]
    publish(nats_names, [(json.dumps(d).encode(), {"Nats-Msg-Id": d["invoiceId"]}) for d in docs])
    port = free_port()
    with partner(kind="invoices") as p:
        p.hold()
        env = {**os.environ, "ONCEQ_NATS_URL": nats_names.url}
        args = [
            "--stream", nats_names.stream, "--durable", nats_names.durable, "--id-field",
            "invoiceId", "--url", f"{p.url}/api/invoices", "--db", str(tmp_path / "m.db"),
            "--prefetch", "2", "--metrics-port", str(port),
        ]  # fmt: skip
        proc = subprocess.Popen(
            [sys.executable, "-m", "onceq", "nats", "consume", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        try:
            wait_for(lambda: answers(port) and p.held() == 2, timeout=30)

            def depths() -> dict[str, float]:
                return Scrape(port).by("onceq_queue_messages", "state", flow="default")

            # 10 stored, 2 taken (their calls held): 8 pending, 2 unacked.
            want = {"ready": 8, "unacked": 2, "redelivering": 0, "dead": 0}
            wait_for(lambda: depths() == want, timeout=30, step=0.5)
            p.release()
        finally:
            proc.send_signal(signal.SIGTERM)
            _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
