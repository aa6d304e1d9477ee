"""Several consumers on one queue at once: every file handled exactly once, none locked out.

Real processes on one queue and one ledger: four `onceq dirq consume` started
independently, and `onceq dirq consume --workers 4`. The queue holds many copies of
the same msg_id, some right next to each other in name order, so that two processes
claim both copies at the same moment and race to insert the same primary key.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_dirq_crash import check_invariants, make_queue, start

N = 5000


def summaries(procs: list, timeout: float = 60) -> list[dict[str, int]]:  # type: ignore[type-arg]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        assert p.returncode == 0, stderr
        assert "locked" not in stderr.lower(), stderr
        out.append(json.loads(stdout))
    return out


@pytest.mark.parametrize("seed", [11, 12])
def test_four_independent_consumers_handle_every_file_exactly_once(
    tmp_path: Path, seed: int
) -> None:
    root = tmp_path / "q"
    exp = make_queue(root, N, seed=seed, resend=0.15, adjacent=0.2)
    assert len(exp.resent) > 500  # many ids have copies, many of them side by side
    # No ledger yet: the four also race to create it.
    procs = [start("dirq", "consume", str(root), "--json") for _ in range(4)]
    results = summaries(procs)

    assert sum(r["received"] for r in results) == N
    assert sum(r["processed"] for r in results) == len(exp.files_of)
    copies = len(exp.valid_files) - len(exp.files_of)
    assert sum(r["duplicates"] for r in results) == copies
    assert sum(r["quarantined"] for r in results) == len(exp.bad)
    assert sum(r["recovered"] for r in results) == 0
    # They really ran side by side (otherwise this proves nothing about races).
    assert sum(1 for r in results if r["received"] > 0) >= 2, results
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
