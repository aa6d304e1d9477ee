"""`onceq status --json` against the truth, read independently: the queue folders, the
broker (rabbitmqctl), the ledger (sqlite3 / psycopg) — on both kinds of ledger.

A flow file with a directory-queue flow and a RabbitMQ flow (a temporary vhost, its
topology declared by `mq topology --flows`), both calling a real partner stub that
rejects some claims (no docs: 422, dead) and answers 503 to others (BUSY: a delayed
retry), consumed by a real `onceq run`; then more messages arrive that nobody
consumes. And what status must never do: create or change a ledger, crash on one
flow's missing queue, say more than one line for a missing file.
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
from typing import Any

import psycopg
import pytest

from cli_support import invoke
from mq_support import claim_doc, cli, ctl, partner, vhost, wait_for, write_claims
from onceq._ledger.schema import VERSION
from onceq._ledger.target import is_pg_url
from support import snapshot


def truth_ledger(target: str, flow: str) -> dict[str, Any]:
    queries = {
        "processed": "SELECT count(*) FROM {s}messages WHERE flow = %s",
        "duplicates": "SELECT count(*) FROM {s}duplicates WHERE flow = %s",
        "by_reason": "SELECT reason, count(*) FROM {s}failures WHERE flow = %s"
        " AND action = 'dead' GROUP BY reason",
    }
    out: dict[str, Any] = {}
    if is_pg_url(target):
        with psycopg.connect(target, autocommit=True) as conn:
            for k, sql in queries.items():
                out[k] = conn.execute(sql.format(s="onceq."), (flow,)).fetchall()
    else:
        conn = sqlite3.connect(f"file:{target}?mode=ro", uri=True)
        try:
            for k, sql in queries.items():
                out[k] = conn.execute(sql.format(s="").replace("%s", "?"), (flow,)).fetchall()
        finally:
            conn.close()
    return {
        "processed": out["processed"][0][0],
        "duplicates": out["duplicates"][0][0],
        "dead_by_reason": dict(out["by_reason"]),
        "dead": sum(n for _, n in out["by_reason"]),
    }


def truth_ledger_or_none(target: str, flow: str) -> dict[str, Any] | None:
    try:
        return truth_ledger(target, flow)
    except (sqlite3.Error, psycopg.Error):  # not made yet by the starting consumer
        return None


def truth_broker(url: str) -> dict[str, dict[str, int]]:
    rows = json.loads(
        ctl(
            "list_queues", "-p", vhost(url), "name", "messages_ready",
            "messages_unacknowledged", "consumers", "--formatter", "json",
        ) or "[]"
    )  # fmt: skip
    return {
        r["name"]: {
            "ready": int(r["messages_ready"]),
            "unacked": int(r["messages_unacknowledged"]),
            "consumers": int(r["consumers"]),
        }
        for r in rows
    }


def flow_file(tmp_path: Path, ledger: str, amqp_url: str, partner_url: str) -> Path:
    f = tmp_path / "flows.toml"
    f.write_text(
        f"ledger = {json.dumps(ledger)}\n"
        '[flows.files]\nsource = "dirq"\npath = "q"\nid_field = "guid"\nretry = "none"\n'
        f'[flows.files.http]\nurl = "{partner_url}/v1/claims"\n'
        '[flows.mq]\nsource = "rabbitmq"\nqueue = "claim.in"\nexchange = "eai.claim"\n'
        'routing_key = "claim"\ndead_letter_exchange = "eai.dlx"\n'
        f'dead_letter_queue = "claim.dead"\nurl = "{amqp_url}"\nid_field = "guid"\n'
        f'[flows.mq.http]\nurl = "{partner_url}/v1/claims"\n'
        '[flows.mq.retry]\nimmediate = 0\ndelays = ["10m"]\n'
        "[flows.mq.breaker]\nenabled = false\n"
    )
    return f


def status_json(*args: str, cwd: Path | None = None) -> dict[str, Any]:
    got = invoke("status", *args, "--json", cwd=cwd)
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)


def test_status_json_matches_the_ledger_the_folders_and_the_broker(
    tmp_path: Path, ledger_target: str, amqp_url: str
) -> None:
    with partner(keys=False) as p:
        f = flow_file(tmp_path, ledger_target, amqp_url, p.url)
        assert invoke("dirq", "init", str(tmp_path / "q")).returncode == 0
        good = [claim_doc(f"d{i}") for i in range(5)]
        write_claims(
            tmp_path / "q" / "inbox",
            [*good, good[0], claim_doc("d-nodocs1", docs=[]), claim_doc("d-nodocs2", docs=[])],
        )
        (tmp_path / "q" / "inbox" / "noid.json").write_text('{"claimId": "CL-x"}')
        r = cli(amqp_url, "mq", "topology", "--flows", str(f))
        assert r.returncode == 0, r.stderr
        sent = write_claims(
            tmp_path / "mq",
            [
                *[claim_doc(f"m{i}") for i in range(4)],
                claim_doc("m0"),  # a copy: a duplicate
                claim_doc("m-nodocs", docs=[]),  # 422: dead
                claim_doc("m-busy", "BUSY-1"),  # 503: into the 10m tier
            ],
        )
        r = cli(amqp_url, "mq", "publish", *map(str, sent))
        assert r.returncode == 0, r.stderr
        r = invoke("run", str(f), "--flow", "files", "--until-empty", timeout=120)
        assert r.returncode == 0, r.stderr
        # The RabbitMQ flow until everything is settled (--until-empty would wait for
        # the copy in the 10m tier): processed, dead-lettered, in its tier; then SIGTERM.
        proc = subprocess.Popen(
            [sys.executable, "-m", "onceq", "run", str(f), "--flow", "mq"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:

            def settled() -> bool:
                if truth_ledger_or_none(ledger_target, "mq") is None:
                    return False
                t = truth_broker(amqp_url)
                return (
                    t["claim.in"]["ready"] + t["claim.in"]["unacked"] == 0
                    and t["claim.retry.10m"]["ready"] == 1
                    and t["claim.dead"]["ready"] == 1
                    and truth_ledger(ledger_target, "mq")["processed"] == 4
                )

            wait_for(settled, 60, step=0.2)
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err

    # What arrives later and nobody consumes: two files, two messages.
    later = write_claims(tmp_path / "later", [claim_doc("late1"), claim_doc("late2")])
    for i, src in enumerate(later):
        (tmp_path / "q" / "inbox" / f"late{i}.json").write_bytes(src.read_bytes())
    old = time.time() - 90
    os.utime(tmp_path / "q" / "inbox" / "late0.json", (old, old))
    r = cli(amqp_url, "mq", "publish", *map(str, later))
    assert r.returncode == 0, r.stderr

    doc = status_json(str(f))
    flows = doc["flows"]
    assert list(flows) == ["files", "mq"]
    assert doc["ledger"]["exists"] is True and doc["ledger"]["error"] is None

    # The ledger, both flows, as sqlite3 / psycopg read it.
    for name in ("files", "mq"):
        want = truth_ledger(ledger_target, name)
        got = flows[name]["ledger"]
        assert {k: got[k] for k in want} == want, name
    assert flows["files"]["ledger"]["processed"] == 5
    assert flows["files"]["ledger"]["duplicates"] == 1
    assert flows["files"]["ledger"]["dead_by_reason"] == {"http-422": 2, "missing-field": 1}
    assert flows["mq"]["ledger"]["processed"] == 4
    assert flows["mq"]["ledger"]["dead_by_reason"] == {"http-422": 1}

    # The directory queue, as the folders hold it.
    q = flows["files"]["queue"]
    assert flows["files"]["queue_error"] is None
    assert (q["inbox"], q["processing"], q["retry"], q["error"]) == (2, 0, 0, 3)
    assert q["inbox"] == len(list((tmp_path / "q" / "inbox").glob("*.json")))
    assert q["error"] == len(list((tmp_path / "q" / "error").glob("*.json")))
    assert 85 <= q["oldest_age_s"] < 300

    # The broker, as rabbitmqctl reads it.
    mq = flows["mq"]
    assert mq["queue_error"] is None, mq["queue_error"]
    truth = truth_broker(amqp_url)
    by_state = {x["state"]: x for x in mq["queue"]["queues"]}
    assert set(by_state) == {"ready", "retry", "dead"}
    for x in mq["queue"]["queues"]:
        assert x["exists"] is True
        t = truth[x["name"]]
        assert (x["ready"], x["consumers"]) == (t["ready"], t["consumers"]), x
        assert x["unacked"] in (t["unacked"], None), x
    assert by_state["ready"]["name"] == "claim.in" and by_state["ready"]["ready"] == 2
    assert by_state["retry"]["name"] == "claim.retry.10m" and by_state["retry"]["ready"] == 1
    assert by_state["dead"]["name"] == "claim.dead" and by_state["dead"]["ready"] == 1


def test_status_never_creates_or_changes_a_ledger(tmp_path: Path) -> None:
    f = tmp_path / "flows.toml"
    f.write_text('ledger = "ledger.db"\n[flows.a]\nsource = "dirq"\npath = "q"\nid_field = "id"\n')
    assert invoke("dirq", "init", str(tmp_path / "q")).returncode == 0
    before = snapshot(tmp_path)
    doc = status_json(str(f))
    assert snapshot(tmp_path) == before  # a missing ledger is not created
    assert doc["ledger"]["exists"] is False and "not created" in doc["ledger"]["note"]
    assert doc["flows"]["a"]["ledger"] == {
        "processed": 0,
        "duplicates": 0,
        "dead": 0,
        "dead_by_reason": {},
        "failures": 0,
        "retried": 0,
    }
    # A ledger with rows: its bytes are the same after status.
    (tmp_path / "q" / "inbox" / "m1.json").write_text('{"id": "m1"}')
    (tmp_path / "q" / "inbox" / "m2.json").write_text('{"x": 1}')
    assert invoke("run", str(f), "--until-empty").returncode == 0
    db = tmp_path / "ledger.db"
    raw = db.read_bytes()
    doc = status_json(str(f))
    assert doc["flows"]["a"]["ledger"]["processed"] == 1
    assert db.read_bytes() == raw
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (VERSION,)
    # --db: every flow the ledger holds, counts only.
    doc = status_json("--db", str(db))
    assert list(doc["flows"]) == ["a"] and doc["flows"]["a"]["queue"] is None
    assert doc["flows"]["a"]["source"] is None
    assert db.read_bytes() == raw
    missing = tmp_path / "nope" / "ledger.db"
    doc = status_json("--db", str(missing))
    assert doc["flows"] == {} and not missing.parent.exists()


def test_status_on_pg_never_creates_the_schema(pg_url: str, tmp_path: Path) -> None:
    doc = status_json("--db", pg_url)
    assert doc["ledger"]["exists"] is False and doc["flows"] == {}
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert conn.execute("SELECT to_regnamespace('onceq')").fetchone() == (None,)


def test_one_flows_trouble_is_its_entrys_reason(tmp_path: Path, amqp_url: str) -> None:
    down = "amqp://guest:s3cr3t-pw@127.0.0.1:1/%2F"  # nothing listens on port 1
    f = tmp_path / "flows.toml"
    f.write_text(
        'ledger = "ledger.db"\n'
        '[flows.nofolder]\nsource = "dirq"\npath = "missing"\nid_field = "id"\n'
        f'[flows.nobroker]\nsource = "rabbitmq"\nqueue = "x.in"\nurl = "{down}"\n'
        '[flows.novhost]\nsource = "rabbitmq"\nqueue = "x.in"\n'
        f'url = "{amqp_url.rsplit("/", 1)[0]}/no-such-vhost"\n'
    )
    got = invoke("status", str(f), "--json")
    assert got.returncode == 0, got.stderr
    assert "s3cr3t-pw" not in got.stdout + got.stderr  # no URL password, out or err
    assert got.stderr == ""  # aiormq's own connection errors stay quiet
    doc = json.loads(got.stdout)
    for name in ("nofolder", "nobroker", "novhost"):
        e = doc["flows"][name]
        assert e["queue"] is None and e["queue_error"], (name, e)
        assert "\n" not in e["queue_error"]
    assert "not a queue" in doc["flows"]["nofolder"]["queue_error"]
    assert "does not exist" in doc["flows"]["novhost"]["queue_error"]


def test_mistakes_are_one_line_each(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[flows.a]\nsource = "dirq"\n[flows.b]\nsource = "nats"\npath = "q"\n')
    got = invoke("status", str(bad))
    assert got.returncode == 2 and got.stdout == ""
    lines = got.stderr.splitlines()
    assert len(lines) >= 2 and all(x.startswith("onceq: ") for x in lines), lines
    assert "Traceback" not in got.stderr
    got = invoke("status", str(tmp_path / "missing.toml"))
    assert got.returncode == 3 and len(got.stderr.splitlines()) == 1, got.stderr
    got = invoke("status", cwd=tmp_path)  # no ./flows.toml, no --db
    assert got.returncode == 3 and len(got.stderr.splitlines()) == 1, got.stderr
    assert "flows.toml" in got.stderr
    got = invoke("status", "--flow", "zz", str(bad.with_name("ok.toml")))
    assert got.returncode == 3


def test_default_flow_file_and_flow_filter(tmp_path: Path) -> None:
    (tmp_path / "flows.toml").write_text(
        '[flows.a]\nsource = "dirq"\npath = "qa"\nid_field = "id"\n'
        '[flows.b]\nsource = "dirq"\npath = "qb"\nid_field = "id"\n'
    )
    doc = status_json(cwd=tmp_path)
    assert list(doc["flows"]) == ["a", "b"]
    doc = status_json("--flow", "b", cwd=tmp_path)
    assert list(doc["flows"]) == ["b"]
    got = invoke("status", "--flow", "zz", cwd=tmp_path)
    assert got.returncode == 2 and "zz" in got.stderr


@pytest.mark.parametrize("args", [("--interval", "0"), ("--interval", "nan")])
def test_bad_interval_is_usage(tmp_path: Path, args: tuple[str, ...]) -> None:
    got = invoke("status", "--db", str(tmp_path / "l.db"), "--watch", *args)
    assert got.returncode == 2 and "Traceback" not in got.stderr


def test_an_unreachable_ledger(tmp_path: Path) -> None:
    url = "postgresql://postgres:s3cr3t-pw@127.0.0.1:1/x"
    got = invoke("status", "--db", url)
    assert got.returncode == 8 and len(got.stderr.splitlines()) == 1, got.stderr
    assert "s3cr3t-pw" not in got.stdout + got.stderr
    # With a flow file the queues are still shown; the ledger's trouble is its note.
    f = tmp_path / "flows.toml"
    f.write_text(f'ledger = "{url}"\n[flows.a]\nsource = "dirq"\npath = "q"\nid_field = "id"\n')
    assert invoke("dirq", "init", str(tmp_path / "q")).returncode == 0
    doc = status_json(str(f))
    assert doc["ledger"]["error"] and "s3cr3t-pw" not in json.dumps(doc)
    assert doc["flows"]["a"]["ledger"] is None and doc["flows"]["a"]["queue"]["inbox"] == 0
    human = invoke("status", str(f))
    assert human.returncode == 0 and "cannot read the ledger" in human.stdout
