"""`onceq status` over a PostgreSQL ledger whose password comes from ${ENV}: the
password is in no output (human, --json, --db, --watch --json) and in no row the
consumers publish. (PostgreSQL here trusts loopback, so any password logs in: the
point is only where the text could travel.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg

from cli_support import invoke

SECRET = "Zq9-status-pw-77"


def _with_password(pg_url: str) -> str:
    # postgresql://postgres@127.0.0.1:5432/db -> postgresql://postgres:${PGPW}@…
    head, rest = pg_url.split("://", 1)
    user, host = rest.split("@", 1)
    return f"{head}://{user}:${{PGPW}}@{host}"


def test_a_pg_ledger_password_never_shows(pg_url: str, tmp_path: Path) -> None:
    q = tmp_path / "q"
    for sub in ("inbox", "processing", "done", "error"):
        (q / sub).mkdir(parents=True)
    for i in range(4):
        (q / "inbox" / f"m-{i}.json").write_text(json.dumps({"msg_id": f"m-{i}"}))
    (q / "inbox" / "bad.json").write_text("{not json")
    ledger = _with_password(pg_url)
    flows = tmp_path / "flows.toml"
    flows.write_text(
        f'ledger = "{ledger}"\n[flows.orders]\nsource = "dirq"\npath = "./q"\nid_field = "msg_id"\n'
    )
    env = {"PGPW": SECRET}
    done = invoke("run", str(flows), "--until-empty", "--json", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    outputs = [done.stdout + done.stderr]
    runs = []
    for args in (
        ("status", str(flows)),
        ("status", str(flows), "--json"),
        ("status", "--db", ledger.replace("${PGPW}", SECRET), "--json"),
        ("status", "--db", ledger.replace("${PGPW}", SECRET)),
    ):
        r = invoke(*args, env=env, cwd=tmp_path)
        assert r.returncode == 0, (args, r.stderr)
        outputs.append(r.stdout + r.stderr)
        runs.append(r)
    doc = json.loads(runs[1].stdout)  # status FILE --json
    assert doc["flows"]["orders"]["ledger"]["processed"] == 4
    assert doc["flows"]["orders"]["ledger"]["dead_by_reason"] == {"parse": 1}
    # --watch --json: one document a line until stopped.
    watch = subprocess.Popen(
        [sys.executable, "-m", "onceq", "status", str(flows), "--watch", "--json",
         "--interval", "0.2"],
        cwd=tmp_path, env={**os.environ, **env},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        first = watch.stdout.readline()  # type: ignore[union-attr]
        assert json.loads(first)["flows"]["orders"]["ledger"]["processed"] == 4
    finally:
        watch.terminate()
        out, err = watch.communicate(timeout=30)
    outputs.append(first + out + err)
    for text in outputs:
        assert SECRET not in text
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT consumer, host, state FROM onceq.consumers").fetchall()
    assert rows and all(SECRET not in " ".join(map(str, r)) for r in rows)
