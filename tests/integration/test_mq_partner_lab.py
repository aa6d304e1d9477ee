"""The claim-system stub (a real process) and the seed-001 lab layout (`onceq lab mq`)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mq_support import CLAIMS, ctl, partner, queues, rows
from support import plain_env, run_cli


def _post(url: str, body: bytes) -> int:
    req = urllib.request.Request(
        f"{url}/v1/claims", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_stub_answers_by_the_rules_and_counts_every_call() -> None:
    with partner() as p:
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
        req = urllib.request.Request(f"{p.url}/_reset", method="POST", data=b"")
        urllib.request.urlopen(req, timeout=5).close()
        assert p.stats()["total"] == 0 and p.stats()["by_guid"] == {}
        assert p.stop() == 0  # SIGTERM stops it cleanly


def test_stub_delay_overlaps_concurrent_calls() -> None:
    with partner(delay=0.5) as p:
        body = json.dumps({"guid": "g", "claimId": "C", "docs": ["a"]}).encode()
        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda _: _post(p.url, body), range(8)))
        assert codes == [201] * 8
        assert time.monotonic() - t0 < 1.5  # 8 x 0.5 s serially would be 4 s
        assert p.stats()["peak_in_flight"] == 8


def test_stub_refuses_a_busy_port_in_one_line() -> None:
    with partner() as p:
        r = run_cli("partner", "claim", "--port", str(p.port), timeout=20)
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
    # The exercise's own words, from the lab folder: python3 publish.py claim.json
    assert (d / "claim.json").read_bytes() == (CLAIMS / "claim-001.json").read_bytes()
    r = script("publish.py", "claim.json", cwd=d)
    assert r.returncode == 0, r.stderr
    assert script(str(d / "publish.py"), str(CLAIMS / "claim-007-nodocs.json")).returncode == 0
    with partner() as p:
        run = script(str(d / "consumer.py"), "--claim", p.url, "--max-seconds", "2")
        assert run.returncode == 0, run.stderr
        assert p.stats()["total"] == 2
    db = d / "processed.db"  # the default ledger lives beside the script
    assert rows(db, "SELECT count(*) FROM processed") == [(1,)]
    assert queues(amqp_url) == {"claim.in": (0, 0), "claim.dead": (1, 0)}
