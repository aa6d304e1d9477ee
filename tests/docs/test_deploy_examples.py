"""docs/deploy.md: its examples run as written, and its systemd unit is one systemd accepts.

The page's one-machine walk-through (two `onceq run` processes standing in for two
hosts, one broker, one PostgreSQL ledger) runs line by line as the README's examples
do (tests/docs/doc_examples.py), with the page's database host pointed at a temporary
database of the test's own: `postgresql://onceq…@db.internal:5432/app` becomes
`postgresql://postgres…@127.0.0.1:5432/<temp>` (trust authentication: the page's
password is accepted, so it travels through every command as a real one would).
Then what the page promises is checked on what the run left behind: one ledger row
per claim, the two consumers' summaries adding up to every delivery, the partner
called once per claim although each claim was queued twice in a row (twins that two
processes may hold at once: the cross-process guard's case), the queue empty, and the
password in no output.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from doc_examples import examples
from test_readme_examples import run_examples

from mq_support import queues

pytestmark = [pytest.mark.broker, pytest.mark.pg, pytest.mark.slow]

DOC = "docs/deploy.md"
CLAIMS = 200
SECRET = "s3cret"  # the PGPASSWORD the page's lines set


def _replace(pg_url: str) -> dict[str, str]:
    """The page's database → the test's (same password part, the postgres role)."""
    db = pg_url.rsplit("/", 1)[1]
    return {
        r"postgresql://onceq(:\$\{PGPASSWORD\})?@db\.internal:5432/app": (
            rf"postgresql://postgres\1@127.0.0.1:5432/{db}"
        )
    }


def test_deploy_examples_run_as_written(tmp_path: Path, amqp_url: str, pg_url: str) -> None:
    ran = run_examples(DOC, tmp_path, amqp_url, replace=_replace(pg_url))
    out = {ex.line.split("#")[0].strip(): stdout for ex, stdout in ran}

    def output(prefix: str) -> str:
        return next(v for k, v in out.items() if k.startswith(prefix))

    # One ledger row per claim, none twice.
    assert output("psql").strip() == f"{CLAIMS}|{CLAIMS}"
    # The two "hosts" shared the 400 deliveries: every one processed or a duplicate.
    summaries = [json.loads((tmp_path / f"host-{h}.json").read_text()) for h in "ab"]
    flows = [s["flows"]["claims"] for s in summaries]
    assert sum(f["processed"] for f in flows) == CLAIMS, summaries
    assert sum(f["duplicates"] for f in flows) == CLAIMS, summaries
    assert all(f["dead"] == 0 for f in flows), summaries
    # The partner: one 201 per claim, each claim called once, the key always its guid.
    stats = json.loads(output("curl -s http://127.0.0.1:9202/_stats"))
    assert stats["by_status"] == {"201": CLAIMS}, stats["by_status"]
    assert set(stats["by_guid"].values()) == {1}, stats["by_guid"]
    assert stats["by_key"] == stats["by_guid"]
    # Nothing left in the queues; the page's `mq status` says so too.
    depths = queues(amqp_url)
    assert depths["claim.in"] == (0, 0) and depths["claim.dead"][0] == 0, depths
    # The password reached no output, the consumers' JSON summaries included.
    texts = [*out.values(), *((tmp_path / f"host-{h}.json").read_text() for h in "ab")]
    assert not any(SECRET in t for t in texts)


def test_deploy_unit_is_one_systemd_accepts(tmp_path: Path) -> None:
    """The page's unit, as written but for ExecStart's path (this venv's onceq)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")  # a failure under CI=true
    todo, _ = examples(DOC)
    unit = next(ex.command for ex in todo if ex.file == "onceq.service")
    onceq = Path(sys.executable).parent / "onceq"
    assert "ExecStart=/opt/onceq/.venv/bin/onceq run " in unit
    unit = unit.replace("/opt/onceq/.venv/bin/onceq", str(onceq))
    path = tmp_path / "onceq.service"
    path.write_text(unit)
    done = subprocess.run(
        [analyze, "verify", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    # verify exits 0 even for a value it ignores ("Failed to parse …, ignoring"): any
    # word on stderr is a mistake in the unit.
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    # What the page promises of it, literally: no secret in the unit, the stop timeout
    # above onceq's own grace (http.timeout 10 s + 5 s), restarts on failure only.
    settings = dict(
        line.split("=", 1) for line in unit.splitlines() if "=" in line and line[0] != "#"
    )
    assert settings["Restart"] == "on-failure" and settings["KillSignal"] == "SIGTERM"
    assert int(settings["TimeoutStopSec"]) > 10 + 5
    assert settings["EnvironmentFile"].startswith("/etc/onceq/")
    assert "Environment" not in settings, "a secret in Environment= is shown to anyone"
    assert not any("@" in v or "password" in v.lower() for v in settings.values()), settings
