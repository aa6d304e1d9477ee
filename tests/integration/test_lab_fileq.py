"""`onceq lab fileq`: seed 000's layout under R/q, and its scripts run as a user runs them."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

import pytest

from cli_support import invoke
from support import SAMPLE, open_db, plain_env, snapshot

SCRIPTS = ("consume.py", "lag.sh", "replay.sh")


def _processed(q: Path) -> int:
    with open_db(q / "ledger.db") as conn:
        return int(conn.execute("SELECT count(*) FROM processed").fetchone()[0])


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a generated script as the exercise says: with the machine's own python3 (or
    the #! line), the venv not activated, from any folder."""
    return subprocess.run(
        cmd, capture_output=True, text=True, cwd=cwd, timeout=120, env=plain_env()
    )


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """R/q built and run once with the built-in sample, from a cwd outside the repo."""
    base = tmp_path_factory.mktemp("lab")
    cwd = base / "elsewhere"
    cwd.mkdir()
    r = invoke("lab", "fileq", "--root", str(base / "R"), "--json", cwd=cwd)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["order_result"] == "OK"
    return base / "R" / "q"


def test_the_sample_run_gives_the_expected_layout(lab: Path) -> None:
    q = lab
    for folder in ("inbox", "processing", "done", "error"):
        assert (q / folder).is_dir()
    assert len(os.listdir(q / "done")) == 18
    assert sorted(os.listdir(q / "error")) == ["msg-009.json", "msg-015.json"]
    assert os.listdir(q / "processing") == []
    assert os.listdir(q / "inbox") == []
    assert _processed(q) == 15
    assert (q / "dup.txt").read_text() == "m-0003\nm-0007\nm-0012\n"
    with open(q / "error.csv", newline="") as f:
        assert list(csv.reader(f)) == [
            ["file", "reason"],
            ["msg-009.json", "parse"],
            ["msg-015.json", "missing-field"],
        ]
    assert (q / "order-result.txt").read_text().splitlines()[0] == "OK"
    for script in SCRIPTS:
        assert os.access(q / script, os.X_OK), script
    schema = list(csv.reader((q / "schema.csv").read_text().splitlines()))
    assert schema[0] == ["field", "type", "role"]
    assert ["msg_id", "string", "idempotency-key"] in schema
    assert ["seq", "integer", "sequence"] in schema
    assert ["amount", "number", ""] in schema


def test_order_check_sql_is_the_query_behind_order_result(lab: Path, tmp_path: Path) -> None:
    out = tmp_path / "again.txt"
    r = invoke(
        "dirq", "order-check", "--db", str(lab / "ledger.db"),
        "--sql", str(lab / "order-check.sql"), "-o", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == (lab / "order-result.txt").read_bytes()


def test_consume_py_again_from_anywhere_changes_nothing(lab: Path, tmp_path: Path) -> None:
    watched = ("dup.txt", "error.csv", "order-result.txt", "schema.csv")
    before = {n: (lab / n).read_bytes() for n in watched}
    folders = {f: sorted(os.listdir(lab / f)) for f in ("inbox", "done", "error", "processing")}
    for cwd in (tmp_path, Path("/")):
        r = _run(["python3", str(lab / "consume.py")], cwd)
        assert r.returncode == 0, r.stderr
        assert len(r.stdout.strip().splitlines()) == 1
        assert "15 ledger rows" in r.stdout
    assert _processed(lab) == 15
    assert {n: (lab / n).read_bytes() for n in watched} == before
    assert {f: sorted(os.listdir(lab / f)) for f in folders} == folders
    assert not (tmp_path / "ledger.db").exists()


def test_consume_py_consumes_new_messages_into_its_own_queue(tmp_path: Path) -> None:
    r = invoke("lab", "fileq", "--root", str(tmp_path / "R"), "--no-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    q = tmp_path / "R" / "q"
    r = _run([str(q / "consume.py")], Path("/"))  # executable, via its #! line
    assert r.returncode == 0, r.stderr
    assert "20 received, 15 processed, 3 duplicates, 0 recovered, 2 quarantined" in r.stdout
    assert r.stderr == f"consume.py: new ledger at {q / 'ledger.db'}: no message seen before\n"
    assert _processed(q) == 15
    assert (q / "dup.txt").read_text() == "m-0003\nm-0007\nm-0012\n"
    assert len((q / "error.csv").read_text().splitlines()) == 3
    # A message dropped in later is consumed by the next run, and only it.
    (q / "inbox" / "late.json").write_text(
        json.dumps({"msg_id": "m-late", "order_no": "Z-1", "seq": 1, "amount": 5})
    )
    r = _run(["python3", str(q / "consume.py")], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "1 received, 1 processed" in r.stdout
    assert r.stderr == ""  # the ledger exists now: no note
    assert _processed(q) == 16
    # A run in which every message failed says so first.
    (q / "inbox" / "bad.json").write_text("{not json")
    r = _run(["python3", str(q / "consume.py")], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "every message failed: 1 quarantined (parse 1)", r.stdout


def test_lag_sh_exit_codes(lab: Path, tmp_path: Path) -> None:
    lag = str(lab / "lag.sh")
    r = _run([lag, str(lab), "0"], tmp_path)
    assert (r.returncode, r.stdout) == (0, "inbox=0 processing=0 error=2\n")
    (lab / "inbox" / "pending.json").write_text("{}")
    try:
        assert _run([lag, str(lab), "1"], tmp_path).returncode == 0
        r = _run([lag, str(lab), "0"], tmp_path)
        assert (r.returncode, r.stdout) == (1, "inbox=1 processing=0 error=2\n")
    finally:
        (lab / "inbox" / "pending.json").unlink()
    for args in ([str(tmp_path / "nope"), "1"], [str(lab), "-1"], [str(lab), "abc"], [str(lab)]):
        r = _run([lag, *args], tmp_path)
        assert r.returncode == 2, args
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_replay_sh_exit_codes_and_effect(tmp_path: Path) -> None:
    assert invoke("lab", "fileq", "--root", str(tmp_path / "R")).returncode == 0
    q = tmp_path / "R" / "q"
    replay = str(q / "replay.sh")
    before = snapshot(q)
    for name, code in (("nope.json", 3), ("..", 2), ("a/b", 2), ("", 2)):
        r = _run([replay, name], tmp_path)
        assert r.returncode == code, (name, r.stderr)
    assert _run([replay], tmp_path).returncode == 2
    assert snapshot(q) == before
    (q / "inbox" / "msg-015.json").write_text("{}")
    assert _run([replay, "msg-015.json"], tmp_path).returncode == 4
    (q / "inbox" / "msg-015.json").unlink()
    assert snapshot(q) == before
    r = _run([replay, "msg-009.json"], Path("/"))
    assert r.returncode == 0, r.stderr
    assert (q / "inbox" / "msg-009.json").exists()
    assert not (q / "error" / "msg-009.json").exists()
    with open_db(q / "ledger.db") as conn:
        assert conn.execute("SELECT ref FROM replays").fetchall() == [("msg-009.json",)]


def test_no_run_only_queues_and_writes_the_scripts(tmp_path: Path) -> None:
    r = invoke("lab", "fileq", "--root", str(tmp_path / "R"), "--no-run", "--json")
    assert r.returncode == 0, r.stderr
    q = tmp_path / "R" / "q"
    assert len(os.listdir(q / "inbox")) == 20
    assert sorted(os.listdir(q / "inbox")) == sorted(p.name for p in SAMPLE.glob("*.json"))
    for f in ("done", "error", "processing"):
        assert os.listdir(q / f) == []
    assert not (q / "ledger.db").exists()
    assert not (q / "order-result.txt").exists()
    for f in (*SCRIPTS, "schema.csv", "order-check.sql"):
        assert (q / f).is_file(), f
    assert "seq,integer,sequence" in (q / "schema.csv").read_text()


def test_fixtures_from_a_folder(tmp_path: Path) -> None:
    fx = tmp_path / "fx"
    fx.mkdir()
    for i, seq in enumerate((1, 2, 2), start=1):
        (fx / f"o{i}.json").write_text(
            json.dumps({"msg_id": f"x{i}", "order_no": "K", "seq": seq, "amount": 1, "vip": True})
        )
    (fx / "notes.txt").write_text("not a message")
    r = invoke("lab", "fileq", "--root", str(tmp_path / "R"), "--fixtures", str(fx), "--json")
    assert r.returncode == 0, r.stderr
    q = tmp_path / "R" / "q"
    assert json.loads(r.stdout)["queued"] == 3
    assert sorted(os.listdir(q / "done")) == ["o1.json", "o2.json", "o3.json"]
    assert "vip,boolean," in (q / "schema.csv").read_text()
    result = (q / "order-result.txt").read_text().splitlines()
    assert result[0] == "order_no,problem,seq_from,seq_to,n,msg_ids"
    assert result[1:] == ["K,repeated,2,2,2,x2 x3"]


def test_a_second_lab_run_is_refused_and_loses_nothing(lab: Path, tmp_path: Path) -> None:
    before = snapshot(lab)
    r = invoke("lab", "fileq", "--root", str(lab.parent))
    assert r.returncode == 4
    assert r.stderr.startswith("onceq: ") and len(r.stderr.strip().splitlines()) == 1
    assert snapshot(lab) == before


def test_bad_fixtures_are_refused_before_anything_is_made(tmp_path: Path) -> None:
    r = invoke("lab", "fileq", "--root", str(tmp_path / "R"), "--fixtures", str(tmp_path / "no"))
    assert r.returncode == 3
    (tmp_path / "empty").mkdir()
    r = invoke("lab", "fileq", "--root", str(tmp_path / "R"), "--fixtures", str(tmp_path / "empty"))
    assert r.returncode == 2
    assert not (tmp_path / "R").exists()


def test_lab_fileq_help_has_an_example() -> None:
    r = invoke("lab", "fileq", "--help")
    assert r.returncode == 0
    assert "Example" in r.stdout


def test_a_root_or_q_that_is_a_file_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "file"
    root.write_text("not a folder")
    r = invoke("lab", "fileq", "--root", str(root))
    assert r.returncode == 2  # click's own check of --root
    assert "Traceback" not in r.stderr
    assert root.read_text() == "not a folder"
    (tmp_path / "R").mkdir()
    (tmp_path / "R" / "q").write_text("mine")
    r = invoke("lab", "fileq", "--root", str(tmp_path / "R"))
    assert r.returncode == 4
    assert r.stderr.startswith("onceq: ") and len(r.stderr.strip().splitlines()) == 1
    assert (tmp_path / "R" / "q").read_text() == "mine"
    assert os.listdir(tmp_path / "R") == ["q"]


@pytest.mark.parametrize("name", ["--help", "-h", "--json", "-x.json"])
def test_replay_sh_moves_a_file_whose_name_looks_like_an_option(tmp_path: Path, name: str) -> None:
    # Without `--` before the arguments, `replay.sh --help` printed help and exited 0
    # (a replay that silently did nothing) and `replay.sh --json` was a usage error.
    assert invoke("lab", "fileq", "--root", str(tmp_path / "R")).returncode == 0
    q = tmp_path / "R" / "q"
    (q / "error" / name).write_text("{}")
    r = _run([str(q / "replay.sh"), name], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (q / "inbox" / name).read_text() == "{}"
    assert not (q / "error" / name).exists()
    # The conventional end of options is accepted too and means the same.
    (q / "error" / "-y.json").write_text("{}")
    r = _run([str(q / "replay.sh"), "--", "-y.json"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (q / "inbox" / "-y.json").exists()


def test_lag_sh_takes_a_queue_folder_whose_name_starts_with_a_dash(tmp_path: Path) -> None:
    assert invoke("lab", "fileq", "--root", str(tmp_path / "R"), "--no-run").returncode == 0
    assert invoke("dirq", "init", "--", "-q", cwd=tmp_path).returncode == 0
    r = _run([str(tmp_path / "R" / "q" / "lag.sh"), "-q", "0"], tmp_path)
    assert (r.returncode, r.stdout) == (0, "inbox=0 processing=0 error=0\n"), r.stderr
