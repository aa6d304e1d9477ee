"""`onceq dirq dead purge QDIR (FILE… | --all | --reason R)`: files deleted from error/
for good, audited in dead_ops with their ids before the first unlink; a dry run, a
declined question and every refusal change nothing (folders, ledger bytes)."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

from cli_support import invoke
from dirq_retry_support import all_places, files, flags, make_queue, scripted_partner


def _state(q: Path) -> tuple[dict[str, list[str]], str]:
    db = q / "ledger.db"
    digest = hashlib.sha256(db.read_bytes()).hexdigest() if db.exists() else ""
    return all_places(q), digest


def _quarantined(tmp_path: Path) -> Path:
    """error/ holds bad.json (parse), m-R.json (http-422), m-T.json (http-503)."""
    q = make_queue(tmp_path, ["R", "T", "OK"])
    (q / "inbox" / "bad.json").write_text("{nope")
    with scripted_partner(plan={"R": [(422, None)], "T": [(503, None)] * 5}) as p:
        assert invoke("dirq", "consume", str(q), *flags(p.url, "--retry", "none")).returncode == 0
    assert files(q, "error") == ["bad.json", "m-R.json", "m-T.json"]
    return q


def _ops(q: Path) -> list[tuple]:
    with closing(sqlite3.connect(q / "ledger.db")) as conn:
        return conn.execute(
            "SELECT transport, op, filter, ids, count, finished_at IS NOT NULL FROM dead_ops"
        ).fetchall()


def test_purge_by_reason_and_by_name_deletes_those_files_and_audits_their_ids(
    tmp_path: Path,
) -> None:
    q = _quarantined(tmp_path)
    r = invoke("dirq", "dead", "purge", str(q), "--reason", "http-422", "--yes", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["files"], out["done"], out["matched"], out["dry_run"]) == (
        ["m-R.json"],
        1,
        1,
        False,
    )
    assert files(q, "error") == ["bad.json", "m-T.json"]
    [(transport, op, filter, ids, count, finished)] = _ops(q)
    assert (transport, op, ids, count, finished) == ("dirq", "purge", '["R"]', 1, 1)
    assert json.loads(filter) == {"via": "cli", "ids": ["m-R.json"], "reason": "http-422"}

    # A file that never parsed is recorded by its name.
    r = invoke("dirq", "dead", "purge", str(q), "bad.json", "--yes")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{q}: 1 of 1 file(s) deleted from error/ (ids recorded, op ")
    assert files(q, "error") == ["m-T.json"]
    assert _ops(q)[1][3] == '["bad.json"]'
    # The other places are untouched: done/ keeps what was applied.
    assert files(q, "done") == ["m-OK.json"]


def test_a_dry_run_lists_and_changes_nothing(tmp_path: Path) -> None:
    q = _quarantined(tmp_path)
    before = _state(q)
    r = invoke("dirq", "dead", "purge", str(q), "--all", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stdout == (
        f"dry run: would delete 3 file(s) from {q}/error/: bad.json, m-R.json, m-T.json;"
        " nothing changed\n"
    )
    r = invoke("dirq", "dead", "purge", str(q), "--all", "--dry-run", "--json")
    assert json.loads(r.stdout) == {
        "dry_run": True,
        "files": ["bad.json", "m-R.json", "m-T.json"],
    }
    assert _state(q) == before


def test_purge_refusals_change_nothing(tmp_path: Path) -> None:
    q = _quarantined(tmp_path)
    before = _state(q)
    cases = [
        (("m-T.json", "--all"), 2, "name exactly one of FILE…, --all or --reason R"),
        ((), 2, "name exactly one of FILE…, --all or --reason R"),
        (("--all",), 2, "no terminal to confirm on; give --yes"),
        (("nope.json", "m-T.json", "--yes"), 3, "not there: nope.json (nothing purged)"),
        (("../done/m-OK.json", "--yes"), 3, "not there: ../done/m-OK.json"),
        (("--reason", "http-999", "--yes"), 3, "no file with reason 'http-999'"),
        (("--all", "--yes", "--flow", "bad name!"), 2, "bad name!"),
    ]
    for args, code, words in cases:
        r = invoke("dirq", "dead", "purge", str(q), *args)
        assert r.returncode == code, (args, r.returncode, r.stderr)
        assert r.stderr.startswith("onceq: ") and words in r.stderr, (args, r.stderr)
        assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr
        assert _state(q) == before, args
    # Something in error/ that is not a regular file refuses the whole purge.
    os.mkdir(q / "error" / "folder.json")
    before = _state(q)
    r = invoke("dirq", "dead", "purge", str(q), "--all", "--yes")
    assert r.returncode == 2 and "folder.json: not a regular file" in r.stderr, r.stderr
    assert _state(q) == before
    # No ledger: nothing is created, nothing deleted.
    q2 = make_queue(tmp_path, [], name="q2")
    (q2 / "error" / "x.json").write_text("{}")
    r = invoke("dirq", "dead", "purge", str(q2), "--all", "--yes")
    assert r.returncode == 3 and "no ledger database here" in r.stderr, r.stderr
    assert not (q2 / "ledger.db").exists() and files(q2, "error") == ["x.json"]


def _on_a_terminal(args: list[str], answer: str) -> subprocess.CompletedProcess[str]:
    """The command with a terminal as its stdin, answering its question with `answer`."""
    main, other = os.openpty()
    try:
        os.write(main, answer.encode())
        return subprocess.run(
            [sys.executable, "-m", "onceq", *args],
            stdin=other,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        os.close(main)
        os.close(other)


def test_the_question_counts_the_files_and_a_no_deletes_nothing(tmp_path: Path) -> None:
    q = _quarantined(tmp_path)
    before = _state(q)
    r = _on_a_terminal(["dirq", "dead", "purge", str(q), "--reason", "parse"], "n\n")
    assert r.returncode == 0, r.stderr
    assert f"delete 1 file(s) from {q}/error for good? [y/N]" in r.stderr
    assert "purge declined: 1 file(s) left in error/" in r.stderr
    assert _state(q) == before
    r = _on_a_terminal(["dirq", "dead", "purge", str(q), "--all"], "y\n")
    assert r.returncode == 0, r.stderr
    assert "delete 3 file(s)" in r.stderr and files(q, "error") == []
    assert [o[4] for o in _ops(q)] == [3]
