"""`onceq dirq dead list` and `onceq dirq replay (FILE | --all | --reason R)` (issue 8):
list with filters and JSON, bulk replay audited in dead_ops, refusals that change
nothing (folders, ledger bytes), attempts reset so a replayed file is retried again,
an already-processed replay done as a duplicate, and a kill in the middle."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from contextlib import closing
from pathlib import Path

from cli_support import invoke
from dirq_retry_support import all_places, files, flags, make_queue, scripted_partner
from support import run_cli


def _rows(db: Path, sql: str) -> list[tuple]:
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute(sql).fetchall()


def _state(q: Path) -> tuple[dict[str, list[str]], str]:
    """Every folder's files and the ledger's bytes: what a refusal must not change."""
    db = q / "ledger.db"
    digest = hashlib.sha256(db.read_bytes()).hexdigest() if db.exists() else ""
    return all_places(q), digest


def _quarantine(tmp_path: Path) -> tuple[Path, object]:
    """A queue whose error/ holds: m-R (http-422), m-T (http-503, no retry), bad.json
    (parse); m-OK done."""
    q = make_queue(tmp_path, ["R", "T", "OK"])
    (q / "inbox" / "bad.json").write_text("{nope")
    return q, None


def test_dead_list_shows_reason_detail_attempts_and_filters(tmp_path: Path) -> None:
    q, _ = _quarantine(tmp_path)
    with scripted_partner(plan={"R": [(422, None)], "T": [(503, None)] * 5}) as p:
        r = invoke("dirq", "consume", str(q), *flags(p.url, "--retry", "exercise"))
    assert r.returncode == 0, r.stderr
    assert files(q, "error") == ["bad.json", "m-R.json", "m-T.json"]

    r = invoke("dirq", "dead", "list", str(q))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [ln.split()[:3] for ln in lines[:3]] == [
        ["bad.json", "parse", "attempts=1"],
        ["m-R.json", "http-422", "attempts=1"],
        ["m-T.json", "http-503", "attempts=2"],  # the exercise's rule: tried twice
    ]
    assert lines[3] == f"{q}: 3 file(s) in error/"

    r = invoke("dirq", "dead", "list", str(q), "--reason", "http-503", "--json")
    assert r.returncode == 0, r.stderr
    [t] = json.loads(r.stdout)
    assert set(t) == {"file", "msg_id", "reason", "detail", "attempts", "at"}
    assert (t["file"], t["msg_id"], t["reason"], t["attempts"]) == ("m-T.json", "T", "http-503", 2)
    assert t["at"] and t["at"].startswith("20")

    r = invoke("dirq", "dead", "list", str(q), "--reason", "nothing-like-it", "--json")
    assert (r.returncode, json.loads(r.stdout)) == (0, [])
    # Another flow's view: the ledger has no record of these files for it.
    r = invoke("dirq", "dead", "list", str(q), "--flow", "other", "--json")
    assert {f["reason"] for f in json.loads(r.stdout)} == {"unknown"}


def test_dead_list_never_creates_a_ledger(tmp_path: Path) -> None:
    q = make_queue(tmp_path, [])
    r = invoke("dirq", "dead", "list", str(q))
    assert r.returncode == 3, r.stderr
    assert r.stderr.startswith("onceq: ") and "no ledger database here" in r.stderr
    assert len(r.stderr.splitlines()) == 1
    assert not (q / "ledger.db").exists()
    r = invoke("dirq", "dead", "list", str(tmp_path / "nope"))
    assert r.returncode == 3 and "Traceback" not in r.stderr


def test_bulk_replay_by_reason_moves_those_files_and_audits_it(tmp_path: Path) -> None:
    q, _ = _quarantine(tmp_path)
    with scripted_partner(plan={"R": [(422, None)], "T": [(503, None)] * 5}) as p:
        assert invoke("dirq", "consume", str(q), *flags(p.url, "--retry", "none")).returncode == 0
    r = invoke("dirq", "replay", str(q), "--reason", "http-503", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["replayed"], out["count"], out["filter"]) == (
        ["m-T.json"],
        1,
        {"reason": "http-503"},
    )
    assert files(q, "inbox") == ["m-T.json"]
    assert files(q, "error") == ["bad.json", "m-R.json"]
    db = q / "ledger.db"
    [op] = _rows(
        db, "SELECT id, flow, transport, op, filter, queue, count, finished_at FROM dead_ops"
    )
    assert op[:7] == (out["op"], "default", "dirq", "replay", '{"reason": "http-503"}', str(q), 1)
    assert op[7] is not None  # finished
    last_failure = _rows(db, "SELECT max(id) FROM failures WHERE msg_id = 'T'")[0][0]
    assert _rows(db, "SELECT ref, msg_id, op, reset_after FROM replays") == [
        ("m-T.json", "T", out["op"], last_failure)
    ]

    r = invoke("dirq", "replay", str(q), "--all")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{q}: 2 file(s) error/ -> inbox/ (every file;")
    assert files(q, "error") == [] and files(q, "inbox") == ["bad.json", "m-R.json", "m-T.json"]
    assert _rows(db, "SELECT filter, count FROM dead_ops ORDER BY id") == [
        ('{"reason": "http-503"}', 1),
        ('{"all": true}', 2),
    ]


def test_replay_refusals_change_nothing(tmp_path: Path) -> None:
    q, _ = _quarantine(tmp_path)
    with scripted_partner(plan={"R": [(422, None)], "T": [(503, None)] * 5}) as p:
        assert invoke("dirq", "consume", str(q), *flags(p.url, "--retry", "none")).returncode == 0
    # A namesake of one matching file waits in the inbox: the whole --all is refused,
    # the other files included.
    (q / "inbox" / "m-R.json").write_text('{"id": "R2"}')
    before = _state(q)
    cases = [
        (("--all",), 4, "m-R.json: already in the inbox (nothing replayed)"),
        (("m-T.json", "--all"), 2, "name exactly one of FILE, --all or --reason R"),
        (("--all", "--reason", "parse"), 2, "(not --all and --reason)"),
        ((), 2, "name exactly one of FILE, --all or --reason R"),
        (("--reason", "http-999"), 3, "no file in error/ with reason 'http-999'"),
        (("--reason", "http-422"), 4, "already in the inbox"),
        (("--all", "--flow", "bad name!"), 2, "bad name!"),
    ]
    for args, code, words in cases:
        r = invoke("dirq", "replay", str(q), *args)
        assert r.returncode == code, (args, r.returncode, r.stderr)
        assert r.stderr.startswith("onceq: ") and words in r.stderr, (args, r.stderr)
        assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr
        assert _state(q) == before, args
    # Something in error/ that is not a regular file refuses --all too.
    os.unlink(q / "inbox" / "m-R.json")
    os.symlink("/etc/passwd", q / "error" / "link.json")
    before = _state(q)
    r = invoke("dirq", "replay", str(q), "--all")
    assert r.returncode == 2 and "not a regular file" in r.stderr, r.stderr
    assert _state(q) == before
    # A queue without a ledger: the reasons are unknown; nothing is created.
    q2 = make_queue(tmp_path, [], name="q2")
    (q2 / "error" / "x.json").write_text("{}")
    r = invoke("dirq", "replay", str(q2), "--all")
    assert r.returncode == 3 and "no ledger database here" in r.stderr, r.stderr
    assert not (q2 / "ledger.db").exists() and files(q2, "error") == ["x.json"]


def test_a_replayed_file_gets_its_retries_again(tmp_path: Path) -> None:
    q = make_queue(tmp_path, ["T"])
    policy = ("--immediate-retries", "1", "--retry-delays", "200ms", "--no-breaker")
    # Five 503s: the first run spends its 3 attempts on three of them (dead); after
    # the replay the count starts again, so the file gets 3 more tries and the
    # third succeeds. Without the reset its first new failure would be attempt 4: dead.
    with scripted_partner(plan={"T": [(503, None)] * 5}) as p:
        r = invoke("dirq", "consume", str(q), *flags(p.url, *policy))
        # Its only file failed: the batch ends 11 (every message failed).
        assert r.returncode == 11 and json.loads(r.stdout)["quarantined"] == 1, r.stdout
        assert len(p.times("T")) == 3
        assert invoke("dirq", "replay", str(q), "--reason", "http-503").returncode == 0
        r = invoke("dirq", "consume", str(q), *flags(p.url, *policy))
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert (out["processed"], out["requeued"], out["quarantined"]) == (1, 2, 0), out
        assert p.by_id()["T"] == [503] * 5 + [201]
    assert files(q, "done") == ["m-T.json"]
    db = q / "ledger.db"
    assert _rows(db, "SELECT action, attempt FROM failures ORDER BY id") == [
        ("requeue", 1), ("delay", 2), ("dead", 3), ("requeue", 1), ("delay", 2),
    ]  # fmt: skip


def test_a_replayed_file_already_processed_is_a_duplicate_in_done(tmp_path: Path) -> None:
    q = make_queue(tmp_path, ["X"])
    with scripted_partner(plan={"X": [(503, None)]}) as p:
        r = invoke("dirq", "consume", str(q), *flags(p.url, "--retry", "none"))
        assert json.loads(r.stdout)["quarantined"] == 1
        # The same message arrives again under another name and succeeds.
        (q / "inbox" / "again-X.json").write_text('{"id": "X"}')
        assert json.loads(invoke("dirq", "consume", str(q), *flags(p.url)).stdout)["processed"] == 1
        assert invoke("dirq", "replay", str(q), "--all").returncode == 0
        r = invoke("dirq", "consume", str(q), *flags(p.url))
        out = json.loads(r.stdout)
        assert (out["duplicates"], out["processed"], out["quarantined"]) == (1, 0, 0), out
        assert p.by_id()["X"] == [503, 201]  # the replay called nobody
    assert files(q, "done") == ["again-X.json", "m-X.json"] and files(q, "error") == []


def test_a_bulk_replay_killed_midway_loses_nothing(tmp_path: Path) -> None:
    ids = ["1", "2", "3", "4"]
    q = make_queue(tmp_path, ids)
    with scripted_partner(plan={i: [(422, None)] for i in ids}) as p:
        # Four rejections, under the guard's 10: all quarantined, and the batch ends 11.
        assert invoke("dirq", "consume", str(q), *flags(p.url)).returncode == 11
        assert len(files(q, "error")) == 4
        env = {"ONCEQ_FAULT": "mid-replay", "ONCEQ_FAULT_AFTER": "2"}
        r = run_cli("dirq", "replay", str(q), "--all", env=env)
        assert r.returncode == -9, r.stderr
        # Recorded (all four replays, in one transaction), not finished; two files
        # linked into the inbox and still in error/, none lost.
        db = q / "ledger.db"
        assert _rows(db, "SELECT count, finished_at FROM dead_ops") == [(4, None)]
        assert files(q, "inbox") == ["m-1.json", "m-2.json"]
        assert files(q, "error") == [f"m-{i}.json" for i in ids]
        # The consumer takes the two that are back; the partner now accepts them.
        r = invoke("dirq", "consume", str(q), *flags(p.url))
        assert json.loads(r.stdout)["processed"] == 2
    assert files(q, "done") == ["m-1.json", "m-2.json"]
    names = files(q, "done") + files(q, "error")
    assert set(names) == {f"m-{i}.json" for i in ids}
