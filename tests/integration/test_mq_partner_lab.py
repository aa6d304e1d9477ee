"""The claim-system stub (a real process) and the seed-001 lab layout (`onceq lab mq`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cli_support import invoke
from mq_support import CLAIMS, count, ctl, partner, post, queues, rows, wait_for
from support import plain_env, run_cli


def _post(url: str, body: bytes, key: str | None = None) -> int:
    return post(f"{url}/v1/claims", body, key)[0]


def test_stub_answers_by_the_rules_and_counts_every_call() -> None:
    with partner(keys=False) as p:  # posts by hand, some without the header
        ok = json.dumps({"guid": "g1", "claimId": "C-1", "docs": ["a.pdf"]}).encode()
        assert _post(p.url, ok) == 201
        assert _post(p.url, ok) == 201
        assert (
            _post(p.url, json.dumps({"guid": "g2", "claimId": "C-2", "docs": []}).encode()) == 422
        )
        assert _post(p.url, json.dumps({"guid": "g3", "claimId": "C-3"}).encode()) == 422
        busy = json.dumps({"guid": "g4", "claimId": "BUSY-9", "docs": ["a"]}).encode()
        assert _post(p.url, busy) == 503
        assert _post(p.url, b"not json") == 400
        stats = p.stats()
        assert stats["total"] == 6
        assert stats["by_guid"]["g1"] == 2 and stats["by_guid"]["g4"] == 1
        assert stats["by_claim"] == {"C-1": 2, "C-2": 1, "C-3": 1, "BUSY-9": 1}
        assert (stats["by_key"], stats["key_missing"], stats["key_mismatch"]) == ({}, 6, 6)
        req = urllib.request.Request(f"{p.url}/_reset", method="POST", data=b"")
        urllib.request.urlopen(req, timeout=5).close()
        assert p.stats()["total"] == 0 and p.stats()["by_guid"] == {}
        assert p.stats()["key_missing"] == 0
        assert p.stop() == 0  # SIGTERM stops it cleanly


def test_stub_records_the_idempotency_key_of_every_call() -> None:
    """What every consume test relies on (partner() checks the keys at its end)."""
    body = json.dumps({"guid": "g1", "claimId": "C-1", "docs": ["a.pdf"]}).encode()
    with partner(keys=False) as p:
        assert _post(p.url, body, key="g1") == 201
        p.check_keys()  # the right key passes …
        assert _post(p.url, body, key="g2") == 201  # … a wrong one is counted …
        assert _post(p.url, body) == 201  # … and so is a missing one
        stats = p.stats()
        assert stats["by_key"] == {"g1": 1, "g2": 1}
        assert (stats["key_missing"], stats["key_mismatch"]) == (1, 2)
        with pytest.raises(AssertionError):
            p.check_keys()


def test_stub_holds_calls_until_released() -> None:
    """The gate the timing tests build on: held calls are counted, unanswered, and
    answered oldest first, n at a time or all at once."""
    with partner() as p:
        p.hold()
        bodies = [json.dumps({"guid": f"g{i}", "claimId": "C", "docs": ["a"]}) for i in range(4)]
        with ThreadPoolExecutor(4) as pool:
            calls = []
            for i, b in enumerate(bodies):
                calls.append(pool.submit(_post, p.url, b.encode(), f"g{i}"))
                wait_for(lambda i=i: p.held() == i + 1, timeout=10)  # in this order
            stats = p.stats()
            assert stats["held_keys"] == ["g0", "g1", "g2", "g3"] and stats["total"] == 4
            assert not any(c.done() for c in calls)
            bad = urllib.request.Request(f"{p.url}/_release?n=-1", data=b"", method="POST")
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(bad, timeout=5)
            assert refused.value.code == 400 and p.held() == 4  # a bad count frees nothing
            assert p.release(1) == 1
            assert calls[0].result(timeout=10) == 201
            assert p.stats()["held_keys"] == ["g1", "g2", "g3"]
            assert not any(c.done() for c in calls[1:])
            assert p.release() == 3
            assert [c.result(timeout=10) for c in calls] == [201] * 4
        assert _post(p.url, bodies[0].encode(), "g0") == 201  # no longer holding
        assert p.stats()["held"] == 0 and p.stats()["peak_in_flight"] == 4
        p.hold()  # a held call does not keep a stopping stub alive
        with ThreadPoolExecutor(1) as pool:
            late = pool.submit(_post, p.url, bodies[1].encode(), "g1")
            wait_for(lambda: p.held() == 1, timeout=10)
            assert p.stop() == 0
            late.exception(timeout=10)  # answered or cut off, but not hanging


def test_stub_delay_overlaps_concurrent_calls() -> None:
    """8 calls held until all are in, then released together: their delays overlap
    (an asyncio.sleep), so all 8 are answered in about one delay, not 8."""
    delay = 1.0
    with partner(delay=delay) as p:
        p.hold()
        body = json.dumps({"guid": "g", "claimId": "C", "docs": ["a"]}).encode()
        with ThreadPoolExecutor(8) as pool:
            calls = [pool.submit(_post, p.url, body, "g") for _ in range(8)]
            wait_for(lambda: p.held() == 8, timeout=15)  # all 8 in flight at once
            t0 = time.monotonic()
            p.release()
            codes = [c.result(timeout=30) for c in calls]
            took = time.monotonic() - t0
        assert codes == [201] * 8
        assert took >= delay  # the delay is applied …
        assert took < 4 * delay, took  # … once, not 8 times in a row (8 s)
        assert p.stats()["peak_in_flight"] == 8


def test_stub_refuses_a_busy_port_in_one_line() -> None:
    with partner() as p:
        r = invoke("partner", "claim", "--port", str(p.port), timeout=20)
    assert r.returncode == 2 and str(p.port) in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.broker
def test_lab_mq_writes_the_layout_and_its_scripts_work(amqp_url: str, tmp_path: Path) -> None:
    r = run_cli("lab", "mq", "--root", str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr
    d = tmp_path / "eaimw" / "mq"
    for name in ("mq-up.sh", "topology.py", "publish.py", "consumer.py"):
        assert os.access(d / name, os.X_OK), name
    assert "Memory high watermark setting: 0.5369 gb" in (d / "status.txt").read_text()
    broker = json.loads(ctl("-n", "rabbit@localhost", "status", "--formatter", "json"))
    assert broker["vm_memory_high_watermark_setting"] == {"absolute": 512 * 2**20}

    # The exercise's literal commands: the machine's python3, the venv not activated.
    env = plain_env({"EAI_AMQP_URL": amqp_url})
    env.pop("EAI_MQ_DB", None)

    def script(*args: str, cwd: Path = tmp_path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["python3", *args], capture_output=True, text=True, env=env, timeout=60,
            cwd=cwd,
        )  # fmt: skip

    assert script(str(d / "topology.py")).returncode == 0
    assert script(str(d / "topology.py")).returncode == 0  # twice: no error
    bad = script(str(d / "publish.py"), str(tmp_path / "nope.json"))
    assert bad.returncode == 3  # a missing file is "not found" (3) in every command
    assert queues(amqp_url) == {"claim.in": (0, 0), "claim.dead": (0, 0)}  # nothing sent
    # The exercise's own words, from the lab folder: python3 publish.py claim.json
    assert (d / "claim.json").read_bytes() == (CLAIMS / "claim-001.json").read_bytes()
    r = script("publish.py", "claim.json", cwd=d)
    assert r.returncode == 0, r.stderr
    assert script(str(d / "publish.py"), str(CLAIMS / "claim-007-nodocs.json")).returncode == 0
    assert script(str(d / "publish.py"), str(CLAIMS / "claim-008-busy.json")).returncode == 0
    busy = json.loads((CLAIMS / "claim-008-busy.json").read_bytes())["guid"]
    db = d / "processed.db"  # the default ledger lives beside the script
    with partner() as p:
        # Until the three claims have their outcome in the ledger (not --max-seconds,
        # which passes or fails with the machine's load), then SIGTERM as an operator
        # would. 1 processed; failures: the no-docs claim's, the BUSY claim's two.
        run = subprocess.Popen(
            ["python3", str(d / "consumer.py"), "--claim", p.url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
        )  # fmt: skip
        try:
            wait_for(lambda: (count(db, "processed"), count(db, "failures")) == (1, 3), 60)
            wait_for(lambda: queues(amqp_url)["claim.dead"] == (2, 0), 30)
        finally:
            run.send_signal(signal.SIGTERM)
            _, err = run.communicate(timeout=60)
        assert run.returncode == 0, err
        stats = p.stats()
        assert stats["total"] == 4
    # The exercise's rule, exactly: the BUSY claim (503) is called twice — requeued
    # once, then dead-lettered — with no delayed retry and no breaker.
    assert stats["by_guid"][busy] == 2
    assert rows(db, "SELECT attempt, action FROM failures WHERE msg_id = ? ORDER BY id", busy) == [
        (1, "requeue"),
        (2, "dead"),
    ]
    assert rows(db, "SELECT count(*) FROM processed") == [(1,)]
    # topology.py declared the exercise's objects only: no retry queue.
    assert queues(amqp_url) == {"claim.in": (0, 0), "claim.dead": (2, 0)}
