"""A typo in a ledger path is refused, never a new empty ledger; a new ledger is announced.

A new, empty ledger in front of an existing queue is the one way to apply every message
twice, so its folder is never created (--db, EAI_MQ_DB), and a run that does create a
ledger file says so on stderr, once, with stdout left clean (JSON stays parseable).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_support import invoke, sample_queue
from mq_support import EXERCISE, claim_doc, cli, publish, queues, topology, write_claims
from support import run_cli, snapshot

NOTE = "no message seen before"


def _refused(r: object, folder: Path) -> None:
    """Exit 8, one line naming the missing folder, no traceback, nothing announced."""
    err = r.stderr  # type: ignore[attr-defined]
    assert r.returncode == 8, err  # type: ignore[attr-defined]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"onceq: {folder}: no such folder"), lines
    assert "Traceback" not in err and NOTE not in err


def test_dirq_consume_with_a_mistyped_db_folder_changes_nothing(tmp_path: Path) -> None:
    q = sample_queue(tmp_path)
    typo = tmp_path / "ledgers-typo" / "deep"
    before = snapshot(tmp_path)
    for args in ((), ("--workers", "2"), ("--json",)):
        # --workers forks: that one in a process of its own, not a fork of the test's.
        run = run_cli if "--workers" in args else invoke
        r = run("dirq", "consume", str(q), "--db", str(typo / "ledger.db"), *args)
        _refused(r, typo)
        assert r.stdout == ""
    assert not (tmp_path / "ledgers-typo").exists()
    assert snapshot(tmp_path) == before  # the queue untouched, no ledger anywhere


def test_dirq_replay_with_a_mistyped_db_folder_changes_nothing(tmp_path: Path) -> None:
    q = sample_queue(tmp_path)
    assert invoke("dirq", "consume", str(q)).returncode == 0
    bad = sorted(p.name for p in (q / "error").iterdir())[0]
    before = snapshot(tmp_path)
    r = invoke("dirq", "replay", str(q), bad, "--db", str(tmp_path / "nope" / "ledger.db"))
    _refused(r, tmp_path / "nope")
    assert snapshot(tmp_path) == before  # still in error/, not in inbox/


def test_a_new_ledger_is_announced_once_and_stdout_stays_json(tmp_path: Path) -> None:
    q = sample_queue(tmp_path)
    db = tmp_path / "ledger.db"  # its folder exists: a new ledger may be made there
    r = invoke("dirq", "consume", str(q), "--db", str(db), "--json")
    assert r.returncode == 0, r.stderr
    assert r.stderr == f"onceq: new ledger at {db}: {NOTE}\n"
    assert json.loads(r.stdout)["processed"] > 0
    # An existing ledger: not a word.
    (q / "inbox" / "late.json").write_text(json.dumps({"msg_id": "late", "order_no": "L"}))
    r = invoke("dirq", "consume", str(q), "--db", str(db), "--json")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert json.loads(r.stdout)["received"] == 1


def test_the_default_ledger_beside_the_queue_is_made_and_announced(tmp_path: Path) -> None:
    q = sample_queue(tmp_path)
    r = run_cli("dirq", "consume", str(q), "--workers", "2")  # forks: a process of its own
    assert r.returncode == 0, r.stderr
    assert r.stderr.count(NOTE) == 1 and f"new ledger at {q / 'ledger.db'}" in r.stderr
    assert (q / "ledger.db").is_file()
    r = invoke("dirq", "consume", str(q))
    assert r.returncode == 0 and NOTE not in r.stderr


def test_a_replay_that_makes_the_ledger_says_so(tmp_path: Path) -> None:
    q = sample_queue(tmp_path)
    assert invoke("dirq", "consume", str(q)).returncode == 0
    bad = sorted(p.name for p in (q / "error").iterdir())[0]
    other = tmp_path / "other.db"
    r = invoke("dirq", "replay", str(q), bad, "--db", str(other))
    assert r.returncode == 0, r.stderr
    assert r.stderr == f"onceq: new ledger at {other}: {NOTE}\n"


@pytest.mark.broker
@pytest.mark.parametrize("how", ["--db", "EAI_MQ_DB"])
def test_mq_consume_with_a_mistyped_ledger_folder_consumes_nothing(
    amqp_url: str, tmp_path: Path, how: str
) -> None:
    topology(amqp_url)
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc("g-1")]))
    typo = tmp_path / "ledgrs"
    db = str(typo / "processed.db")
    args = ["mq", "consume", "--claim", "http://127.0.0.1:9", "--max-seconds", "1", "--json",
            *EXERCISE]  # fmt: skip
    r = cli(amqp_url, *args, "--db", db) if how == "--db" else cli(amqp_url, *args, EAI_MQ_DB=db)
    _refused(r, typo)
    assert r.stdout == ""
    assert not typo.exists()
    # Refused before any delivery was taken: the claim waits, ready, not dead-lettered.
    assert queues(amqp_url) == {"claim.in": (1, 0), "claim.dead": (0, 0)}


@pytest.mark.broker
def test_mq_consume_announces_a_new_ledger_and_not_an_old_one(
    amqp_url: str, tmp_path: Path
) -> None:
    topology(amqp_url)
    db = tmp_path / "processed.db"
    args = ["mq", "consume", "--claim", "http://127.0.0.1:9", "--max-seconds", "0.5", "--json",
            *EXERCISE]  # fmt: skip
    r = cli(amqp_url, *args, EAI_MQ_DB=str(db))
    assert r.returncode == 0, r.stderr
    assert r.stderr == f"onceq: new ledger at {db}: {NOTE}\n"
    assert json.loads(r.stdout)["db"] == str(db)
    r = cli(amqp_url, *args, EAI_MQ_DB=str(db))
    assert r.returncode == 0 and r.stderr == "", r.stderr
