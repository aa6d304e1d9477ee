"""Several consumers on one queue at once: every file handled exactly once, none locked out.

Real processes on one queue and one ledger: four `onceq dirq consume` started
independently, and `onceq dirq consume --workers 4`. The queue holds many copies of
the same msg_id, some right next to each other in name order, so that two processes
claim both copies at the same moment and race to insert the same primary key.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from test_dirq_crash import check_invariants, make_queue, start

from mq_support import wait_for

N = 5000


def summaries(procs: list, timeout: float = 60) -> list[dict[str, int]]:  # type: ignore[type-arg]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        assert p.returncode == 0, stderr
        assert "locked" not in stderr.lower(), stderr
        out.append(json.loads(stdout))
    return out


def _claims_of(root: Path, pid: int) -> int:
    """Message files in the claim folder of the consumer with this pid."""
    n = 0
    for d in (root / "processing").glob(f"w-{pid}-*"):
        n += sum(1 for f in os.listdir(d) if not f.startswith("."))
    return n


def started_together(root: Path, n: int) -> list[subprocess.Popen[str]]:
    """n consumers that each have claimed a message, then all run at once.

    Each is started, and stopped (SIGSTOP) as soon as its claim folder holds a file,
    before the next one starts: so every one of them takes part, whatever the load
    (a consumer that starts late on a busy machine could otherwise find the queue
    already drained). A stopped consumer keeps its lock, so the next one leaves its
    claims alone. Then all are continued together and race for the rest.
    """
    procs: list[subprocess.Popen[str]] = []
    try:
        for _ in range(n):
            p = start("dirq", "consume", str(root), "--json")
            procs.append(p)
            wait_for(lambda p=p: _claims_of(root, p.pid) > 0 or p.poll() is not None, 60, 0.001)
            assert p.poll() is None, "a consumer ended before it claimed anything"
            os.kill(p.pid, signal.SIGSTOP)
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
    return procs


@pytest.mark.parametrize("seed", [11, 12])
def test_four_independent_consumers_handle_every_file_exactly_once(
    tmp_path: Path, seed: int
) -> None:
    root = tmp_path / "q"
    exp = make_queue(root, N, seed=seed, resend=0.15, adjacent=0.2)
    assert len(exp.resent) > 500  # many ids have copies, many of them side by side
    # No ledger yet: the four also race to create it.
    procs = started_together(root, 4)
    results = summaries(procs)

    assert sum(r["received"] for r in results) == N
    assert sum(r["processed"] for r in results) == len(exp.files_of)
    copies = len(exp.valid_files) - len(exp.files_of)
    assert sum(r["duplicates"] for r in results) == copies
    assert sum(r["quarantined"] for r in results) == len(exp.bad)
    assert sum(r["recovered"] for r in results) == 0
    # They really ran side by side (otherwise this proves nothing about races).
    assert all(r["received"] > 0 for r in results), results
    check_invariants(root, exp)


def test_workers_option_handles_every_file_exactly_once(tmp_path: Path) -> None:
    root = tmp_path / "q"
    exp = make_queue(root, N, seed=13, resend=0.15, adjacent=0.2)
    [summary] = summaries([start("dirq", "consume", str(root), "--json", "--workers", "4")])
    assert summary["received"] == N
    assert summary["processed"] == len(exp.files_of)
    assert summary["duplicates"] == len(exp.valid_files) - len(exp.files_of)
    assert summary["quarantined"] == len(exp.bad)
    check_invariants(root, exp)
