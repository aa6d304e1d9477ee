"""The directory queue's retry area (issue 8): a transient failure waits in retry/.

Real folders, a real `onceq dirq consume` process, a scripted HTTP partner in this
process that records when each call came. Delays are checked with a floor (never
earlier than the tier: the due time is the file's mtime) and a generous ceiling
(a loaded 2-core machine), never with sleeps standing in for synchronisation.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

from cli_support import invoke
from dirq_retry_support import all_places, files, flags, make_queue, mtime, scripted_partner
from support import run_cli

# How late a retry may come on a loaded machine (scan + claim + call + commit).
LATE = 1.5


def _failures(db: Path) -> list[tuple[str, str, int]]:
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute("SELECT msg_id, action, attempt FROM failures ORDER BY id").fetchall()


def _popen(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "onceq", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait(predicate, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_transient_failure_waits_in_retry_then_is_claimed_when_due(tmp_path: Path) -> None:
    q = make_queue(tmp_path, ["A", "B"])
    with scripted_partner(plan={"A": [(503, None), (503, None)]}) as p:
        proc = _popen(
            "dirq", "consume", str(q),
            *flags(p.url, "--immediate-retries", "0", "--retry-delays", "1s,2s", "--no-breaker"),
        )  # fmt: skip
        # While A waits, it is in retry/ (not the inbox, not error/), due at its mtime.
        _wait(lambda: files(q, "retry") == ["m-A.json"], 30)
        first = p.times("A")[0]
        due = mtime(q / "retry" / "m-A.json")
        assert first + 1.0 <= due <= first + 1.0 + LATE
        lag = invoke("dirq", "lag", str(q), "0")
        assert lag.returncode == 1  # inbox 0 + retry 1 > 0: a file still waits
        assert lag.stdout.strip().endswith("retry=1")
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert (summary["processed"], summary["requeued"], summary["quarantined"]) == (2, 2, 0)
    t = p.times("A")
    assert len(t) == 3  # failed twice, then succeeded: called 3 times
    assert 1.0 <= t[1] - t[0] <= 1.0 + LATE
    assert 2.0 <= t[2] - t[1] <= 2.0 + LATE
    assert p.times("B") == p.times("B")[:1]  # B: one call
    assert all_places(q) == {
        "inbox": [],
        "processing": [],
        "retry": [],
        "done": ["m-A.json", "m-B.json"],
        "error": [],
    }
    assert [a for _, a, _ in _failures(q / "ledger.db")] == ["delay", "delay"]
    lag = invoke("dirq", "lag", str(q), "0", "--json")
    assert json.loads(lag.stdout) == {
        "inbox": 0,
        "processing": 0,
        "error": 0,
        "retry": 0,
        "waiting": 0,
        "threshold": 0,
        "over": False,
    }


def test_dead_after_the_policy_s_attempts(tmp_path: Path) -> None:
    q = make_queue(tmp_path, ["A"])
    with scripted_partner(plan={"A": [(503, None)] * 10}) as p:
        r = invoke(
            "dirq", "consume", str(q),
            *flags(p.url, "--retry-delays", "300ms,600ms", "--no-breaker"),
        )  # fmt: skip
    assert r.returncode == 11, r.stderr  # its one file dead: every message failed
    out = json.loads(r.stdout)
    assert (out["quarantined"], out["requeued"], out["reasons"]) == (1, 3, {"http-503": 1})
    # 1 try + 1 immediate + 2 delayed = 4 calls, then error/.
    assert len(p.times("A")) == 4
    assert _failures(q / "ledger.db") == [
        ("A", "requeue", 1),
        ("A", "delay", 2),
        ("A", "delay", 3),
        ("A", "dead", 4),
    ]
    assert files(q, "error") == ["m-A.json"] and files(q, "retry") == []
    rep = invoke("dirq", "report", str(q))
    assert rep.returncode == 0, rep.stderr
    assert rep.stdout.strip().endswith("1 errors (files in error/); 0 waiting in retry/")


def test_retry_after_is_honoured(tmp_path: Path) -> None:
    q = make_queue(tmp_path, ["A"])
    # 503 with Retry-After: 2 → the first tier at least 2 s long (3s), not the
    # immediate retry nor the 500ms tier.
    with scripted_partner(plan={"A": [(503, 2)]}) as p:
        r = invoke(
            "dirq", "consume", str(q),
            *flags(p.url, "--immediate-retries", "1", "--retry-delays", "500ms,3s", "--no-breaker"),
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    t = p.times("A")
    assert len(t) == 2
    assert 3.0 <= t[1] - t[0] <= 3.0 + LATE


def test_the_orders_preset_still_quarantines_at_once_and_makes_no_retry_folder(
    tmp_path: Path,
) -> None:
    q = make_queue(tmp_path, [])
    (q / "inbox" / "bad.json").write_text("{not json")
    (q / "inbox" / "ok.json").write_text('{"msg_id":"m1","order_no":"o","seq":1,"amount":1}')
    r = invoke("dirq", "consume", str(q), "--json")
    assert r.returncode == 0, r.stderr
    assert not (q / "retry").exists()
    lag = invoke("dirq", "lag", str(q), "5")
    assert lag.stdout == "inbox=0 processing=0 error=1\n"  # the exercise's exact line


def test_a_stop_signal_wakes_a_run_sleeping_until_a_retry_is_due(tmp_path: Path) -> None:
    q = make_queue(tmp_path, ["A"])
    with scripted_partner(plan={"A": [(503, None)]}) as p:
        proc = _popen(
            "dirq", "consume", str(q),
            *flags(p.url, "--immediate-retries", "0", "--retry-delays", "1h", "--no-breaker"),
        )  # fmt: skip
        _wait(lambda: files(q, "retry") == ["m-A.json"], 30)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 10  # not an hour
    assert proc.returncode == 143, err
    assert json.loads(out)["stopped_by"] == "SIGTERM"
    # It still waits, untouched, and a later run takes it when due.
    assert all_places(q)["retry"] == ["m-A.json"] and files(q, "processing") == []
    assert len(p.times("A")) == 1


def test_workers_share_retry_and_each_ends_when_it_is_empty(tmp_path: Path) -> None:
    ids = [f"{i:02d}" for i in range(20)]
    q = make_queue(tmp_path, ids)
    with scripted_partner(fail_first=2) as p:
        r = run_cli(  # --workers forks: a process of its own
            "dirq", "consume", str(q), "--workers", "2",
            *flags(p.url, "--immediate-retries", "1", "--retry-delays", "300ms", "--no-breaker"),
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["processed"] == 20 and out["quarantined"] == 0
    assert files(q, "done") == [f"m-{i}.json" for i in ids]
    assert all(len(s) == 3 and s[-1] == 201 for s in p.by_id().values())
    assert not files(q, "retry") and not files(q, "processing")


def test_a_python_effect_s_retry_after_is_honoured_on_a_directory_queue(tmp_path: Path) -> None:
    """`raise onceq.Retry(why, after=…)` in a Python effect, through onceq.run on a
    real queue folder: the file waits in retry/ at least that long (the first tier at
    least as long), then succeeds."""
    import onceq

    q = make_queue(tmp_path, ["A"])
    calls: list[float] = []

    def call(doc: dict) -> None:
        calls.append(time.time())
        if len(calls) == 1:
            raise onceq.Retry("busy", after=1.5)

    spec = onceq.MessageSpec(id_field="id")
    retry = onceq.RetryPolicy(immediate=1, delays=("300ms", "2s"))
    flow = onceq.Flow("py", onceq.DirSource(q), spec, effect=call, retry=retry)
    s = onceq.run(flow, ledger=str(tmp_path / "py.db"), until_empty=True)["py"]
    assert (s.processed, s.requeued, s.dead) == (1, 1, 0)
    assert len(calls) == 2
    # Not the immediate retry, not the 300ms tier: the 2s one.
    assert 2.0 <= calls[1] - calls[0] <= 2.0 + LATE
    assert files(q, "done") == ["m-A.json"] and files(q, "retry") == []
