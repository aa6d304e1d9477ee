"""kill -9 of `onceq dirq consume` with an HTTP effect and a flaky partner: the windows
the retry area adds (a failure committed and its file on its way into retry/, a file
claimed from retry/, a file released back to the inbox) lose nothing and apply
nothing twice.

After the kills, a last run finishes. Then every file is in done/ exactly once
(the partner succeeds for each in the end), nothing is left in inbox/, processing/
or retry/, the ledger holds each id once, and the partner took each id as done
exactly once — except an id whose successful call the kill caught before its
commit (seen at the kill: called with success, not in the ledger): that one is
called again and answered 409, which is the at-least-once part the ledger absorbs.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from contextlib import closing
from pathlib import Path

import pytest

from dirq_retry_support import ScriptedPartner, all_places, files, flags, make_queue
from dirq_retry_support import scripted_partner as partner_ctx
from support import run_cli

IDS = [f"{i:03d}" for i in range(60)]
# Fail each id 0, 1 or 2 times before it succeeds; the policy allows 4 attempts, so
# every file ends in done/ (a kill never spends an attempt without a record).
PLAN = {i: [(503, None)] * (int(i) % 3) for i in IDS}
POLICY = ("--immediate-retries", "0", "--retry-delays", "100ms,200ms,300ms")
BREAKER = ("--breaker-probe", "100ms", "--breaker-max-probe", "200ms")
# The campaign's run lasts longer than its latest kill moment: an id failing twice
# waits 0.3 + 0.6 s in retry/ after a start-up of 0.3 s or more.
CAMPAIGN = ("--immediate-retries", "0", "--retry-delays", "300ms,600ms,900ms")


def _ledger_ids(q: Path) -> set[str]:
    db = q / "ledger.db"
    if not db.exists():
        return set()
    with closing(sqlite3.connect(db)) as conn:
        try:
            return {r[0] for r in conn.execute("SELECT msg_id FROM messages")}
        except sqlite3.OperationalError:  # killed while creating the ledger
            return set()


def _caught(p: ScriptedPartner, q: Path) -> set[str]:
    """Ids the partner took as done that the ledger does not hold: the kill fell
    between their call and its commit."""
    p.settled()  # the dead consumer's last requests may still be on their way in
    return set(p.successes()) - _ledger_ids(q)


def _finish(q: Path, url: str, policy: tuple[str, ...] = POLICY) -> None:
    r = run_cli("dirq", "consume", str(q), *flags(url, *policy, *BREAKER), timeout=120)
    assert r.returncode == 0, r.stderr


def _check(q: Path, p: ScriptedPartner, caught: set[str]) -> None:
    names = [f"m-{i}.json" for i in IDS]
    assert all_places(q) == {"inbox": [], "processing": [], "retry": [], "done": names,
                             "error": []}  # fmt: skip
    assert _ledger_ids(q) == set(IDS)
    with closing(sqlite3.connect(q / "ledger.db")) as conn:
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == len(IDS)
    done = p.successes()
    assert set(done) == set(IDS)
    twice = {i for i, n in done.items() if n > 1}
    assert twice <= caught, (twice - caught, done)


POINTS = [
    ("after-retry-link", 1),
    ("after-retry-link", 9),
    ("before-commit", 3),
    ("after-commit-before-settle", 2),
    ("mid-settle", 5),
    ("after-claim", 30),
]


@pytest.mark.parametrize(("point", "after"), POINTS)
def test_killed_at_a_fault_point_with_retries_recovers_exactly(
    tmp_path: Path, point: str, after: int
) -> None:
    q = make_queue(tmp_path, IDS)
    with partner_ctx(plan=PLAN) as p:
        env = {"ONCEQ_FAULT": point, "ONCEQ_FAULT_AFTER": str(after)}
        r = run_cli("dirq", "consume", str(q), *flags(p.url, *POLICY, *BREAKER), env=env)
        assert r.returncode == -9, (r.returncode, r.stderr)
        if point == "after-retry-link":
            # The file is in retry/ AND still claimed: one inode, two names.
            both = set(files(q, "retry")) & set(files(q, "processing"))
            assert both, all_places(q)
            for name in both:
                claim = next((q / "processing").glob(f"*/{name}"))
                assert os.stat(claim).st_ino == os.stat(q / "retry" / name).st_ino
        caught = _caught(p, q)
        _finish(q, p.url)
        _check(q, p, caught)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kill_9_at_random_moments_during_retries_loses_nothing(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    q = make_queue(tmp_path, IDS)
    caught: set[str] = set()
    kills = 0
    with partner_ctx(plan=PLAN) as p:
        for _ in range(12):
            proc = subprocess.Popen(
                [sys.executable, "-m", "onceq", "dirq", "consume", str(q),
                 *flags(p.url, *CAMPAIGN, *BREAKER)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )  # fmt: skip
            # Python's start-up is ~0.3 s: moments from before the first claim to
            # well into the retries (never past the run's end: see CAMPAIGN).
            time.sleep(rng.uniform(0.1, 1.0))
            if proc.poll() is not None:
                assert proc.returncode == 0, proc.stderr.read()  # type: ignore[union-attr]
                break
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            kills += 1
            caught |= _caught(p, q)
        _finish(q, p.url, CAMPAIGN)
        _check(q, p, caught)
    assert kills >= 1
    # The partner was asked about each id at least as often as its plan fails it.
    calls = Counter(c.id for c in p.calls)
    assert all(calls[i] >= len(PLAN[i]) + 1 for i in IDS)
