"""`onceq status` shows what a running consumer publishes: its breaker, then "stopped"
after SIGTERM, and "stale" for one killed with SIGKILL (no final row).

The consumer is a real `onceq run FLOW_FILE` process (tests/heartbeat_cli.py: the
CLI with a heartbeat around each consumer, beating every second), against a real
partner stub that is down (connections refused), on both kinds of ledger.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from cli_support import invoke
from mq_support import claim_doc, partner, wait_for, write_claims

HARNESS = Path(__file__).resolve().parents[1] / "heartbeat_cli.py"


def flow_file(tmp_path: Path, ledger: str, partner_url: str) -> Path:
    invoke("dirq", "init", str(tmp_path / "q"))
    write_claims(tmp_path / "q" / "inbox", [claim_doc(f"g{i}") for i in range(6)])
    f = tmp_path / "flows.toml"
    f.write_text(
        f"ledger = {json.dumps(ledger)}\n"
        '[flows.claims]\nsource = "dirq"\npath = "q"\nid_field = "guid"\n'
        f'[flows.claims.http]\nurl = "{partner_url}/v1/claims"\n'
        '[flows.claims.retry]\nimmediate = 0\ndelays = ["10m"]\n'
        '[flows.claims.breaker]\nfailures = 2\nprobe = "1m"\nmax_probe = "5m"\n'
    )
    return f


def status(f: Path) -> dict[str, Any]:
    got = invoke("status", str(f), "--json")
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)["flows"]["claims"]


def start(f: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HARNESS), "run", str(f)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "ONCEQ_TEST_HEARTBEAT_EVERY": "1"},
    )


def test_breaker_open_then_stopped_then_stale(tmp_path: Path, ledger_target: str) -> None:
    with partner(keys=False, args=("--down-for", "600", "--down-as", "refuse")) as p:
        f = flow_file(tmp_path, ledger_target, p.url)
        proc = start(f)
        try:
            seen: list[dict[str, Any]] = []

            def breaker_open() -> bool:
                seen.append(status(f))
                return seen[-1]["breaker"] == "open"

            wait_for(breaker_open, 30, step=0.3)
            [c] = seen[-1]["consumers"]
            assert c["status"] == "running" and c["stale"] is False
            assert c["pid"] == proc.pid and c["consumer"].split(":")[1] == str(proc.pid)
            assert c["breaker"] == "open"
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
            assert proc.returncode in (0, 143), err
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        after = status(f)
        [c] = after["consumers"]
        assert c["status"] == "stopped" and c["stale"] is False and c["stopping"] is True
        assert after["breaker"] is None  # no running consumer: no breaker to show

        # A consumer killed without its final row: stale after 3 missed beats.
        killed = start(f)
        try:
            wait_for(
                lambda: any(
                    c["pid"] == killed.pid and c["status"] == "running"
                    for c in status(f)["consumers"]
                ),
                30,
                step=0.3,
            )
            killed.send_signal(signal.SIGKILL)
            killed.communicate(timeout=30)
        finally:
            if killed.poll() is None:
                killed.kill()
                killed.communicate()
        wait_for(
            lambda: any(
                c["pid"] == killed.pid and c["status"] == "stale" and c["stale"]
                for c in status(f)["consumers"]
            ),
            40,  # 3 missed beats: 3 s here, 15 s at the default period of a wired telemetry
            step=0.3,
        )
        final = status(f)
        by_pid = {c["pid"]: c for c in final["consumers"]}
        assert by_pid[proc.pid]["status"] == "stopped"  # the first one's row is kept
        assert by_pid[killed.pid]["age_s"] > 3 * by_pid[killed.pid]["every_s"]


def test_status_shows_a_running_consumer_in_the_human_view(tmp_path: Path) -> None:
    with partner(keys=False, args=("--down-for", "600", "--down-as", "refuse")) as p:
        f = flow_file(tmp_path, str(tmp_path / "ledger.db"), p.url)
        proc = start(f)
        try:
            wait_for(lambda: status(f)["breaker"] == "open", 30, step=0.3)
            got = invoke("status", str(f))
            assert got.returncode == 0, got.stderr
            line = next(x for x in got.stdout.splitlines() if "claims" in x)
            assert "open" in line and "1 running" in line, got.stdout
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=60)
