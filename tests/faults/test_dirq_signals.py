"""SIGINT (Ctrl-C) and SIGTERM during a long `onceq dirq consume`: a clean stop.

Real processes, real signals, sent once the run has settled a few hundred files.
The run must stop claiming, settle what it holds, leave processing/ empty, print one
line and exit 128 + the signal; with --workers the parent passes the stop on, and no
worker outlives it. Every file is then in inbox/ (untouched), or done/ / error/ with
its record; the next run finishes the rest and the queue's invariants hold.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_dirq_crash import check_invariants, finish, make_queue, names, rows, settled, start

N = 20_000


def _wait_until_settled(root: Path, proc: subprocess.Popen[str], n: int) -> None:
    deadline = time.monotonic() + 30
    while settled(root) < n and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    assert proc.poll() is None, "the run ended before the signal: the queue is too small"


def _our_processes(root: Path) -> list[int]:
    """Pids of live processes whose command line names this queue."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(root).encode() in cmd:
            pids.append(int(entry.name))
    return pids


def _check_stopped_mid_run(root: Path, r_out: str, r_err: str, sig: signal.Signals) -> None:
    # The first run on this queue makes its ledger and says so; then the one stop line.
    note, *lines = r_err.strip().splitlines()
    assert note == f"onceq: new ledger at {root / 'ledger.db'}: no message seen before", r_err
    assert len(lines) == 1, r_err  # no traceback, from the parent or any worker
    assert lines[0].startswith("onceq: ") and f"stopped by {sig.name}" in lines[0], r_err
    summary = json.loads(r_out)
    assert summary["stopped_by"] == sig.name
    # Clean: no claim and no worker folder left behind.
    assert names(root / "processing") == []
    done, error, inbox = names(root / "done"), names(root / "error"), names(root / "inbox")
    assert len(done) > 0 and len(inbox) > 0, "the stop must fall inside the run"
    assert len(done) + len(error) + len(inbox) == N
    assert summary["received"] == len(done) + len(error)
    # Each settled file has its record, and nothing in the inbox has one.
    refs = {r for (r,) in rows(root / "ledger.db", "SELECT ref FROM processed")}
    dup_refs = {r for (r,) in rows(root / "ledger.db", "SELECT ref FROM duplicates")}
    assert refs | dup_refs == set(done)
    assert not (refs | dup_refs) & set(inbox)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_settles_what_is_claimed_and_exits_cleanly(
    tmp_path: Path, sig: signal.Signals
) -> None:
    root = tmp_path / "q"
    exp = make_queue(root, N, seed=21)
    proc = start("dirq", "consume", str(root), "--json")
    _wait_until_settled(root, proc, 600)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err  # 130 for SIGINT, 143 for SIGTERM
    _check_stopped_mid_run(root, out, err, sig)
    summary = finish(root)
    assert summary["recovered"] == 0  # nothing was left half-way to recover
    check_invariants(root, exp)


@pytest.mark.parametrize("sig, to_group", [(signal.SIGTERM, False), (signal.SIGINT, True)])
def test_workers_stop_with_their_parent(
    tmp_path: Path, sig: signal.Signals, to_group: bool
) -> None:
    # SIGTERM to the parent alone (a service manager): before, the parent died and
    # its four workers went on consuming, orphaned. Ctrl-C reaches the whole group:
    # before, each worker printed a KeyboardInterrupt traceback.
    root = tmp_path / "q"
    exp = make_queue(root, N, seed=22)
    proc = start("dirq", "consume", str(root), "--json", "--workers", "4")
    _wait_until_settled(root, proc, 600)
    if to_group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert _our_processes(root) == [], "a worker outlived its parent"
    _check_stopped_mid_run(root, out, err, sig)
    finish(root)
    check_invariants(root, exp)


def test_a_worker_killed_under_its_parent_is_reported_not_waited_for(tmp_path: Path) -> None:
    # Before: the parent waited for a report from each worker, forever.
    root = tmp_path / "q"
    exp = make_queue(root, N, seed=23)
    proc = start("dirq", "consume", str(root), "--json", "--workers", "2")
    _wait_until_settled(root, proc, 600)
    children = [p for p in _our_processes(root) if p != proc.pid]
    assert children, "no worker found"
    os.kill(children[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    note, *lines = err.strip().splitlines()
    assert note == f"onceq: new ledger at {root / 'ledger.db'}: no message seen before", err
    assert len(lines) == 1 and "died without reporting" in lines[0], err
    assert _our_processes(root) == []
    summary = finish(root)  # the dead worker's claims are recovered
    assert summary["received"] > 0
    check_invariants(root, exp)
