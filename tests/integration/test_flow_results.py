"""order-check, report and replay read one flow's rows (`--flow NAME`), any flow's fields.

A flow other than the orders preset declares its own group and sequence fields; the
order check reads them from that flow's dedup rows, dup.txt lists that flow's
duplicates, and a replay is recorded under that flow. Another flow's rows in the same
ledger never show up.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from cli_support import invoke
from support import snapshot


def _queue(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    msgs = [
        {"id": "s-1", "box": "B1", "n": 1},
        {"id": "s-2", "box": "B1", "n": 3},  # n=2 never came: a gap
        {"id": "s-3", "box": "B2", "n": 1},
        {"id": "s-4", "box": "B2", "n": 1},  # the same n twice under another id: repeated
        {"id": "s-1", "box": "B1", "n": 1},  # a re-sent copy: a duplicate
        {"box": "B3", "n": 1},  # no id: quarantined
    ]
    for i, m in enumerate(msgs):
        (src / f"m-{i}.json").write_text(json.dumps(m))
    q = tmp_path / "q"
    assert invoke("dirq", "init", str(q), "--from", str(src)).returncode == 0
    r = invoke(
        "dirq", "consume", str(q), "--flow", "ship", "--id-field", "id",
        "--group-field", "box", "--seq-field", "n", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)
    assert (stats["processed"], stats["duplicates"], stats["quarantined"]) == (4, 1, 1), stats
    return q


def test_order_check_reads_the_named_flows_group_and_sequence(tmp_path: Path) -> None:
    q = _queue(tmp_path)
    r = invoke("dirq", "order-check", str(q), "--flow", "ship", "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["columns"][0] == "group"
    problems = {(row["group"], row["problem"]) for row in doc["rows"]}
    assert {g for g, _ in problems} == {"B1", "B2"}, doc
    # The flow `default` has no rows in this ledger: its order is trivially intact.
    r = invoke("dirq", "order-check", str(q))
    assert (r.returncode, r.stdout) == (0, "OK\n"), r.stderr


def test_report_and_replay_are_the_flows(tmp_path: Path) -> None:
    q = _queue(tmp_path)
    r = invoke("dirq", "report", str(q), "--flow", "ship", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["duplicates"] == ["s-1"]
    assert (q / "dup.txt").read_text() == "s-1\n"
    assert "m-5.json,missing-field" in (q / "error.csv").read_text()
    r = invoke("dirq", "report", str(q), "--json")  # the flow default saw nothing
    assert json.loads(r.stdout)["duplicates"] == []
    r = invoke("dirq", "replay", str(q), "m-5.json", "--flow", "ship")
    assert r.returncode == 0, r.stderr
    with sqlite3.connect(q / "ledger.db") as conn:
        assert conn.execute("SELECT flow, ref FROM replays").fetchall() == [("ship", "m-5.json")]


def test_a_bad_flow_name_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    q = _queue(tmp_path)
    before = snapshot(tmp_path)
    for argv in (
        ["dirq", "replay", str(q), "m-5.json", "--flow", "no such"],
        ["dirq", "order-check", str(q), "--flow", "'; DROP TABLE messages; --"],
        ["dirq", "report", str(q), "--flow", ""],
    ):
        r = invoke(*argv)
        assert r.returncode == 2, (argv, r.returncode, r.stderr)
        assert r.stderr.startswith("onceq: ") and r.stderr.count("\n") == 1, r.stderr
    assert snapshot(tmp_path) == before


def test_a_file_sent_again_under_its_old_name_is_a_duplicate(tmp_path: Path) -> None:
    """Not 'recovered': that word is for a copy a dead consumer had claimed and committed."""
    q = _queue(tmp_path)
    (q / "inbox" / "m-0.json").write_text(json.dumps({"id": "s-1", "box": "B1", "n": 1}))
    r = invoke("dirq", "consume", str(q), "--flow", "ship", "--id-field", "id", "--json")
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)
    assert (stats["duplicates"], stats["recovered"]) == (1, 0), stats
    assert invoke("dirq", "report", str(q), "--flow", "ship").returncode == 0
    assert (q / "dup.txt").read_text() == "s-1\n"
    assert (q / "done" / "m-0.json.1").exists()  # the first m-0.json stays in done/ too
