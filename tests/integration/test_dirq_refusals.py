"""What a user gets wrong around a queue: a foreign or older ledger, folders the run
cannot write, a QDIR that cannot exist. Each is one line `onceq: …` naming the file and
the reason, a distinct exit code, and no state changed (or, mid-run, nothing lost: the
claimed files wait in processing/ and the next run finishes them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli_support import invoke, sample_queue
from onceq._exercise.processed_table import PROCESSED_TABLE
from onceq._ledger.sqlite import Ledger
from support import open_db, run_cli, snapshot

# The seed's own tutorial ledger (and an older onceq's): `processed` without the
# source and ref columns, no duplicates/failures tables.
OLD_SCHEMA = """
CREATE TABLE processed (msg_id TEXT PRIMARY KEY, order_no TEXT, seq INTEGER, amount REAL,
                        processed_at TEXT NOT NULL);
INSERT INTO processed VALUES ('m-0001', 'A', 1, 1.0, '2024-01-01T00:00:00');
"""


def _one_line(r: subprocess.CompletedProcess[str], *words: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onceq: "), r.stderr
    for w in words:
        assert w in lines[0], (w, r.stderr)


def _msg(msg_id: str, seq: int, amount: float = 1.0) -> bytes:
    return json.dumps({"msg_id": msg_id, "order_no": "A", "seq": seq, "amount": amount}).encode()


# --- the ledger -----------------------------------------------------------------------


def test_a_ledger_of_an_older_schema_is_refused_before_anything_moves(tmp_path: Path) -> None:
    # Before: every insert failed on the missing columns and each good message was
    # quarantined to error/ as "ledger-refused"; report died with a traceback.
    q = sample_queue(tmp_path)
    with open_db(q / "ledger.db") as conn:
        conn.executescript(OLD_SCHEMA)
    before = snapshot(q)
    for args in (("consume",), ("consume", "--workers", "2"), ("report",), ("order-check",)):
        # --workers forks: that one in a process of its own, not a fork of the test's.
        r = (run_cli if "--workers" in args else invoke)("dirq", *args, str(q))
        assert r.returncode == 8, (args, r.stdout, r.stderr)
        _one_line(r, "ledger.db", "processed.source")
        assert snapshot(q) == before, args


def test_a_file_that_is_not_a_ledger_is_left_as_it_was(tmp_path: Path) -> None:
    q = sample_queue(tmp_path)
    empty, text = tmp_path / "empty.db", tmp_path / "notes.db"
    empty.write_bytes(b"")
    text.write_text("not a database, just notes\n" * 10)
    before = snapshot(tmp_path)
    for db in (empty, text):
        r = invoke("dirq", "order-check", "--db", str(db))
        assert r.returncode == 8, r.stderr
        _one_line(r, db.name)
        r = invoke("dirq", "report", str(q), "--db", str(db))
        assert r.returncode == 8, r.stderr
        _one_line(r, db.name)
    # Before: opening the empty file turned it into a WAL database (4 KiB, -wal, -shm).
    assert snapshot(tmp_path) == before


def test_a_refused_business_write_and_a_duplicate_in_one_group(tmp_path: Path) -> None:
    # A rule in the ledger (a trigger) refuses one row: the group's multi-row insert
    # fails and the rows go one by one; the refused message alone is quarantined and
    # the copy of an earlier msg_id is still recognised as a duplicate.
    q = tmp_path / "q"
    src = tmp_path / "src"
    src.mkdir()
    for name, body in {
        "a.json": _msg("m1", 1),
        "b.json": _msg("m2", 2, amount=-5),
        "c.json": _msg("m1", 1),
        "d.json": _msg("m3", 3),
    }.items():
        (src / name).write_bytes(body)
    assert invoke("dirq", "init", str(q), "--from", str(src)).returncode == 0
    assert invoke("dirq", "consume", str(q), "--json").returncode == 0  # creates the ledger
    for name in ("a.json", "b.json", "c.json", "d.json"):
        os.rename(q / "done" / name, q / "inbox" / name)
    with open_db(q / "ledger.db") as conn:
        conn.execute("DELETE FROM processed")
        conn.execute("DELETE FROM messages")  # schema 2: the dedup rows (processed is the preset's)
        conn.execute(
            "CREATE TRIGGER no_negative BEFORE INSERT ON processed WHEN NEW.amount < 0"
            " BEGIN SELECT RAISE(ABORT, 'negative amount'); END"
        )
    r = invoke("dirq", "consume", str(q), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["processed"], out["duplicates"], out["reasons"]) == (2, 1, {"ledger-refused": 1})
    assert sorted(os.listdir(q / "done")) == ["a.json", "c.json", "d.json"]
    assert os.listdir(q / "error") == ["b.json"]
    with open_db(q / "ledger.db") as conn:
        assert conn.execute("SELECT msg_id, ref FROM duplicates").fetchall() == [("m1", "c.json")]


def test_a_ledger_that_fails_mid_write_stops_the_run_and_quarantines_nothing(
    tmp_path: Path,
) -> None:
    # A broken rule in the ledger (a trigger writing to a table that is gone) is the
    # ledger's fault, not the message's: before, every good message went to error/
    # as "ledger-refused". Now the run stops with exit 8 and the next one recovers.
    q = sample_queue(tmp_path)
    Ledger(q / "ledger.db", sql=PROCESSED_TABLE).close()  # the orders preset's tables
    with open_db(q / "ledger.db") as conn:
        conn.execute("CREATE TABLE audit (msg_id TEXT)")
        conn.execute(
            "CREATE TRIGGER audit_it AFTER INSERT ON processed"
            " BEGIN INSERT INTO audit VALUES (NEW.msg_id); END"
        )
        conn.execute("DROP TABLE audit")
    r = invoke("dirq", "consume", str(q))
    assert r.returncode == 8, r.stderr
    _one_line(r, "ledger.db", "audit")
    assert os.listdir(q / "error") == [] and os.listdir(q / "done") == []
    with open_db(q / "ledger.db") as conn:
        conn.execute("DROP TRIGGER audit_it")
    r = invoke("dirq", "consume", str(q), "--json")
    assert r.returncode == 0, r.stderr
    assert (len(os.listdir(q / "done")), len(os.listdir(q / "error"))) == (18, 2)
    assert os.listdir(q / "processing") == []


@pytest.fixture
def no_root_override() -> list[str]:
    """A prefix that runs a command as root without the power to ignore file modes."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]


def _cli(prefix: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "onceq", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


# --- folders the run cannot write -------------------------------------------------------


@pytest.mark.parametrize(
    "folder, workers",
    [("done", "1"), ("error", "1"), ("inbox", "1"), ("processing", "1"), (".", "1"), ("done", "2")],
)
def test_a_folder_the_consumer_cannot_write_is_refused_before_any_claim(
    tmp_path: Path, no_root_override: list[str], folder: str, workers: str
) -> None:
    # Before: a read-only done/ ended the run at the first move with a traceback;
    # with --workers each worker's error came back as a RuntimeError traceback.
    q = sample_queue(tmp_path)
    db = tmp_path / "ledger.db"  # beside the queue: a read-only QDIR still opens it
    Ledger(db).close()
    target = q / folder
    target.chmod(0o555)
    try:
        before = snapshot(q)
        r = _cli(no_root_override, "dirq", "consume", str(q), "--db", str(db), "--workers", workers)
        assert r.returncode == 9, r.stdout + r.stderr  # QueueError
        _one_line(r, str(target.resolve() if folder == "." else target), "not writable")
        assert snapshot(q) == before
    finally:
        target.chmod(0o755)
    assert invoke("dirq", "consume", str(q), "--db", str(db)).returncode == 0
    assert (len(os.listdir(q / "done")), len(os.listdir(q / "error"))) == (18, 2)


def test_a_file_the_consumer_may_not_read_is_quarantined_not_fatal(
    tmp_path: Path, no_root_override: list[str]
) -> None:
    # Before: PermissionError from the read ended the run with a traceback, and every
    # later run stopped at the same file (a poison message by its mode).
    q = sample_queue(tmp_path)
    (q / "inbox" / "msg-001.json").chmod(0)
    r = _cli(no_root_override, "dirq", "consume", str(q), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["reasons"] == {"missing-field": 1, "parse": 1, "unreadable": 1}
    assert "msg-001.json" in os.listdir(q / "error")
    assert invoke("dirq", "report", str(q)).returncode == 0
    assert "msg-001.json,unreadable\n" in (q / "error.csv").read_text()


def test_a_full_disk_mid_run_stops_in_one_line_and_the_next_run_finishes(
    tmp_path: Path,
) -> None:
    # The queue on a tmpfs with no inode to spare: claims (renames) succeed, the
    # ledger (elsewhere) commits, then linking into done/ fails with ENOSPC. Run in
    # a private mount namespace so the tmpfs goes away with the shell, whatever happens.
    # No privilege needed: without root, a user namespace (unshare -r) grants the
    # mount inside it. (Under CI=true a skip here is a failure: see conftest.py.)
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a private tmpfs")
    unshare = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-r", "-m"]
    n = 40
    script = f"""
set -u
mount -t tmpfs -o size=4m,nr_inodes={n + 8} tmpfs "$MNT" || exit 77
{sys.executable} -m onceq dirq init "$MNT/q" --from "$SRC" >/dev/null || exit 90
{sys.executable} -m onceq dirq consume "$MNT/q" --db "$DB" 2>"$ERR"
echo "first=$?"
ls "$MNT/q/done" | wc -l | sed 's/^/done=/'
find "$MNT/q/processing" -name '*.json' | wc -l | sed 's/^/processing=/'
mount -t tmpfs -o remount,size=4m,nr_inodes={n + 100} tmpfs "$MNT" || exit 78
{sys.executable} -m onceq dirq consume "$MNT/q" --db "$DB" --json >"$OUT" || echo "second=$?"
ls "$MNT/q/done" | wc -l | sed 's/^/done2=/'
find "$MNT/q/processing" -mindepth 1 | wc -l | sed 's/^/processing2=/'
"""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(n):
        (src / f"m-{i:03d}.json").write_bytes(_msg(f"id-{i}", i + 1))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = {
        **os.environ,
        "MNT": str(mnt),
        "SRC": str(src),
        "DB": str(tmp_path / "ledger.db"),
        "ERR": str(tmp_path / "err.txt"),
        "OUT": str(tmp_path / "out.json"),
    }
    r = subprocess.run(
        [*unshare, "sh", "-c", script], env=env, text=True, capture_output=True, timeout=120
    )
    assert r.returncode != 78, r.stderr  # mounted, but could not make room again
    if r.returncode == 77 or "unshare failed" in r.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    facts = dict(line.split("=", 1) for line in r.stdout.split())
    err = (tmp_path / "err.txt").read_text()
    assert facts["first"] == "9", (r.stdout, r.stderr, err)  # QueueError
    note, *lines = err.strip().splitlines()  # the first run makes the ledger and says so
    assert note == f"onceq: new ledger at {tmp_path / 'ledger.db'}: no message seen before"
    assert len(lines) == 1 and "done: cannot move" in lines[0], err
    assert "No space left" in lines[0], err
    assert (facts["done"], facts["processing"]) == ("0", str(n)), facts
    assert "second" not in facts, (r.stdout, r.stderr)
    assert (facts["done2"], facts["processing2"]) == (str(n), "0"), facts
    second = json.loads((tmp_path / "out.json").read_text())
    # Committed before the failure, moved now: recovered, not processed twice.
    assert (second["recovered"], second["processed"], second["duplicates"]) == (n, 0, 0)
    with open_db(tmp_path / "ledger.db") as conn:
        assert conn.execute("SELECT count(*) FROM processed").fetchone()[0] == n


# --- a QDIR or demo folder that cannot be made ---------------------------------------


def test_init_under_a_file_or_a_read_only_folder_is_one_line(
    tmp_path: Path, no_root_override: list[str]
) -> None:
    (tmp_path / "afile").write_text("x")
    r = invoke("dirq", "init", str(tmp_path / "afile" / "q"))
    assert r.returncode == 9, r.stderr  # QueueError
    _one_line(r, "afile")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    for args in (("dirq", "init", str(ro / "q")), ("demo", "--dir", str(ro / "d"))):
        r = _cli(no_root_override, *args)
        assert r.returncode == 9, (args, r.stderr)  # QueueError
        _one_line(r, str(ro), "Permission denied")
    assert os.listdir(ro) == []


def test_a_required_list_with_no_field_names_the_option(tmp_path: Path) -> None:
    q = sample_queue(tmp_path)
    before = snapshot(q)
    for command in ("consume", "schema"):
        r = invoke("dirq", command, str(q), "--required", " , ")
        assert r.returncode == 2, r.stderr
        _one_line(r, "--required", "names no field")
    assert snapshot(q) == before
