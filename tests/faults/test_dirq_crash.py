"""kill -9 of real `onceq dirq consume` processes: nothing lost, nothing applied twice.

The queue holds generated messages (unique ones, re-sent copies under other file
names, files that do not parse or lack a field). Consumers are killed with SIGKILL
at random moments, one process or several at once, and a last run recovers. Then
every message file must be in exactly one place, the ledger must hold each msg_id
exactly once, and the duplicates table (and dup.txt) exactly the re-sent ids: a file
committed before a kill and moved after recovery is `recovered`, not a duplicate.

The helpers here (the generator, the invariant check) are also used by
test_dirq_concurrency.py.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from support import open_db, run_cli


@dataclass
class Expected:
    """What the queue holds, known from the generator (not from the code under test)."""

    files_of: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    bad: dict[str, str] = field(default_factory=dict)  # file name -> failure reason

    @property
    def valid_files(self) -> set[str]:
        return {f for files in self.files_of.values() for f in files}

    @property
    def resent(self) -> set[str]:
        return {m for m, files in self.files_of.items() if len(files) > 1}

    @property
    def total(self) -> int:
        return len(self.valid_files) + len(self.bad)


def make_queue(
    root: Path, n: int, seed: int, *, resend: float = 0.08, adjacent: float = 0.0
) -> Expected:
    """Write n message files into a new queue at root; return what they must come to.

    `resend`: share of files that re-send an earlier msg_id (anywhere earlier).
    `adjacent`: share of files that re-send the msg_id of the file just before them,
    so consumers claiming in name order hold both copies at the same moment.
    """
    rng = random.Random(seed)
    r = run_cli("dirq", "init", str(root))
    assert r.returncode == 0, r.stderr
    exp = Expected()
    ids: list[str] = []
    for i in range(n):
        name = f"m-{i:06d}.json"
        roll = rng.random()
        if roll < 0.015:
            body, exp.bad[name] = b'{"msg_id": "broken", ', "parse"
        elif roll < 0.03:
            body = json.dumps({"msg_id": f"x-{i}", "order_no": "o", "seq": i}).encode()
            exp.bad[name] = "missing-field"
        else:
            if ids and roll < 0.03 + adjacent:
                mid = ids[-1]
            elif ids and roll < 0.03 + adjacent + resend:
                mid = rng.choice(ids)
            else:
                mid = f"id-{i:06d}"
                ids.append(mid)
            doc = {"msg_id": mid, "order_no": f"o-{i % 17}", "seq": i, "amount": i / 4}
            body = json.dumps(doc).encode()
            exp.files_of[mid].append(name)
        (root / "inbox" / name).write_bytes(body)
    return exp


def rows(db: Path, sql: str) -> list[tuple[object, ...]]:
    with open_db(db) as conn:
        return conn.execute(sql).fetchall()


def names(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


def check_invariants(root: Path, exp: Expected) -> None:
    """Every file in exactly one place; every msg_id once; duplicates exactly the re-sent."""
    assert names(root / "inbox") == []
    assert names(root / "processing") == []  # no claim left, no worker folder left
    # A consumer killed while building its claim folder (QDIR/.w-ID.new) leaves it
    # empty: no message is ever in one.
    for nursery in root.glob(".w-*"):
        assert set(os.listdir(nursery)) <= {".lock"}, nursery
    done, error = names(root / "done"), names(root / "error")
    assert len(done) == len(set(done))
    assert set(done) == exp.valid_files, "done/ must hold each valid file once, nothing else"
    assert set(error) == set(exp.bad), "error/ must hold each bad file once, nothing else"
    assert len(done) + len(error) == exp.total

    db = root / "ledger.db"
    processed = rows(db, "SELECT msg_id, ref FROM processed")
    assert len(processed) == len(exp.files_of)  # one row per unique valid msg_id
    assert {m for m, _ in processed} == set(exp.files_of)
    for msg_id, ref in processed:
        assert ref in exp.files_of[msg_id]  # the row names a file that carried it

    # Each copy is either the one that took effect or a recorded duplicate, never
    # both; a copy recovered after a kill is neither recorded twice nor a duplicate.
    dups = rows(db, "SELECT msg_id, ref FROM duplicates")
    assert len(dups) == len(set(dups))
    winners = {(m, r) for m, r in processed}
    assert not winners & set(dups)
    every_copy = {(m, f) for m, files in exp.files_of.items() for f in files}
    assert winners | set(dups) == every_copy
    assert {m for m, _ in dups} == exp.resent

    failures = rows(db, "SELECT ref, reason, action FROM failures")
    assert sorted(failures) == sorted((f, reason, "dead") for f, reason in exp.bad.items())

    # dup.txt, written from the ledger, lists exactly the ids that were re-sent.
    r = run_cli("dirq", "report", str(root))
    assert r.returncode == 0, r.stderr
    assert (root / "dup.txt").read_text().split() == sorted(exp.resent)


def _as_from_a_terminal() -> None:
    # SIGINT at its default, as a shell in a terminal starts a command. A test runner
    # started in the background by a non-interactive shell (`… &` in a script) inherits
    # SIGINT ignored, and onceq keeps an ignored SIGINT ignored (nohup's meaning, and
    # how --workers children leave the stop to their parent): the Ctrl-C tests would
    # then test nohup, not Ctrl-C.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(*args: str) -> subprocess.Popen[str]:
    """`python -m onceq ARGS` in a session of its own (so killpg reaches its workers)."""
    return subprocess.Popen(
        [sys.executable, "-m", "onceq", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_as_from_a_terminal,
    )


def settled(root: Path) -> int:
    return len(os.listdir(root / "done")) + len(os.listdir(root / "error"))


def claimed(root: Path) -> int:
    """Message files sitting in worker folders under processing/."""
    n = 0
    for d in (root / "processing").iterdir():
        if d.is_dir():
            n += sum(1 for f in os.listdir(d) if not f.startswith("."))
    return n


def kill_mid_run(root: Path, procs: list[subprocess.Popen[str]], after: int, delay: float) -> None:
    """SIGKILL the consumers once `after` more files are settled (0: `delay` s after start).

    Kill points are chosen by progress, not by the clock alone, so that they land
    inside the run however fast the machine is: in the middle of a group's moves,
    between a commit and its moves, during the claims, or during start-up recovery.
    """
    target = settled(root) + after
    deadline = time.monotonic() + 20
    while after and settled(root) < target and time.monotonic() < deadline:
        if all(p.poll() is not None for p in procs):
            break
        time.sleep(0.001)
    time.sleep(delay)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.communicate(timeout=30)


def finish(root: Path) -> dict[str, object]:
    """The recovery run: consume to the end, exit 0, return its summary."""
    r = run_cli("dirq", "consume", str(root), "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "locked" not in r.stderr
    summary = json.loads(r.stdout)
    parts = ("processed", "duplicates", "recovered", "quarantined")
    assert summary["received"] == sum(summary[k] for k in parts), summary
    return summary


def test_kill_9_at_random_moments_loses_nothing_and_applies_nothing_twice(
    tmp_path: Path,
) -> None:
    root = tmp_path / "q"
    exp = make_queue(root, 3000, seed=1)
    rng = random.Random(7)
    left_in_flight = 0
    # Single consumers, several at once, and a --workers 2 group: each killed by
    # SIGKILL (the whole process group) a random time after it has made progress.
    plan: list[list[tuple[str, ...]]] = [
        [()],
        [(), (), ()],
        [("--workers", "2")],
        [()],
        [(), ()],
        [("--workers", "2"), ()],
    ]
    for i, extra_sets in enumerate(plan):
        if not os.listdir(root / "inbox"):
            break
        procs = [start("dirq", "consume", str(root), "--json", *extra) for extra in extra_sets]
        if i == 3:  # during start-up: imports, or taking over the dead consumers' files
            kill_mid_run(root, procs, after=0, delay=rng.uniform(0.15, 0.4))
        else:
            kill_mid_run(root, procs, after=rng.randint(1, 300), delay=rng.uniform(0, 0.01))
        left_in_flight += claimed(root)
        # Nothing settled twice so far, whatever the kill interrupted.
        settled_names = names(root / "done") + names(root / "error")
        assert len(settled_names) == len(set(settled_names))
        assert not any("." in n.removesuffix(".json") for n in settled_names)  # no NAME.1
    assert left_in_flight > 0, "no kill landed while files were claimed: the test proved nothing"
    finish(root)
    check_invariants(root, exp)


def consume_all(root: Path) -> dict[str, object]:
    r = run_cli("dirq", "consume", str(root), "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def dead_worker(root: Path, name: str = "w-dead") -> Path:
    """A claim folder whose owner is gone: the lock file exists, nobody holds it."""
    d = root / "processing" / name
    d.mkdir()
    (d / ".lock").touch()
    return d


def test_a_copy_committed_before_the_kill_is_recovered_not_a_duplicate(tmp_path: Path) -> None:
    root = tmp_path / "q"
    exp = make_queue(root, 40, seed=3)
    consume_all(root)
    check_invariants(root, exp)
    # Put back the state a kill leaves between the commit and the move (S3): the
    # rows are durable, the files are still in a dead consumer's folder. One is a
    # file that took effect, one a recorded duplicate copy, one a quarantined file.
    winner = rows(root / "ledger.db", "SELECT ref FROM processed ORDER BY ref LIMIT 1")[0][0]
    copy = rows(root / "ledger.db", "SELECT ref FROM duplicates ORDER BY ref LIMIT 1")[0][0]
    bad = sorted(exp.bad)[0]
    dead = dead_worker(root)
    os.rename(root / "done" / winner, dead / winner)
    os.rename(root / "done" / copy, dead / copy)
    os.rename(root / "error" / bad, dead / bad)

    summary = consume_all(root)
    assert summary["recovered"] == 3
    assert summary["processed"] == summary["duplicates"] == summary["quarantined"] == 0
    check_invariants(root, exp)  # no second row, no new duplicate, no second failure


def test_a_crash_between_link_and_unlink_is_finished_without_a_second_copy(
    tmp_path: Path,
) -> None:
    root = tmp_path / "q"
    exp = make_queue(root, 40, seed=4)
    consume_all(root)
    # move_no_clobber links into done/ (or error/) and then unlinks the claim; a
    # kill between the two leaves one inode under both names.
    winner = rows(root / "ledger.db", "SELECT ref FROM processed ORDER BY ref LIMIT 1")[0][0]
    bad = sorted(exp.bad)[0]
    dead = dead_worker(root)
    os.link(root / "done" / winner, dead / winner)
    os.link(root / "error" / bad, dead / bad)
    ino = os.stat(root / "done" / winner).st_ino

    summary = consume_all(root)
    assert summary["recovered"] == 2 and summary["processed"] == 0
    assert not (root / "done" / f"{winner}.1").exists()
    assert not (root / "error" / f"{bad}.1").exists()
    assert os.stat(root / "done" / winner).st_ino == ino
    assert os.stat(root / "done" / winner).st_nlink == 1
    check_invariants(root, exp)


LOCK_HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(120)
"""


def test_a_dead_folder_is_taken_over_and_a_live_one_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "q"
    exp = make_queue(root, 30, seed=5)
    inbox = sorted(os.listdir(root / "inbox"))
    dead, live = dead_worker(root, "w-dead"), dead_worker(root, "w-live")
    for name in inbox[:5]:
        os.rename(root / "inbox" / name, dead / name)
    held = inbox[5:8]
    for name in held:
        os.rename(root / "inbox" / name, live / name)
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(live / ".lock")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        summary = consume_all(root)
        assert summary["received"] == 30 - len(held)
        assert not dead.exists()  # taken over and removed
        assert sorted(os.listdir(live)) == sorted([".lock", *held])  # untouched
        # The live owner's lock is still ours to test: nobody else could take it.
        fd = os.open(live / ".lock", os.O_RDWR)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                raise AssertionError("the live worker's lock was released or replaced")
            except BlockingIOError:
                pass
        finally:
            os.close(fd)
    finally:
        holder.kill()
        holder.wait()
    # Its owner is dead now: the next run takes its files over.
    summary = consume_all(root)
    assert summary["received"] == len(held)
    check_invariants(root, exp)


def test_a_folder_left_by_a_kill_during_start_up_is_swept_once_old(tmp_path: Path) -> None:
    root = tmp_path / "q"
    exp = make_queue(root, 10, seed=6)
    stale, fresh = root / ".w-1-dead.new", root / ".w-2-starting.new"
    for d in (stale, fresh):
        d.mkdir()
        (d / ".lock").touch()
    old = time.time() - 600
    os.utime(stale, (old, old))
    consume_all(root)
    assert not stale.exists()
    assert fresh.exists()  # may belong to a consumer starting right now: left alone
    check_invariants(root, exp)
