"""Issue 9's done-when: 4 consumer processes on one PostgreSQL ledger, two of them
killed with SIGKILL at random moments and restarted.

2,000 claims published while the 4 `onceq mq consume` processes run (one vhost, one
ledger database, the default retry topology), then 600 of them re-sent while they
still run. Two consumers are killed at random moments (a random progress point each,
seed printed) and restarted at once. At the end:

- every claim is recorded exactly once in the ledger (the primary key), and nothing is
  left in any queue (work queue, retry tiers, dead letters);
- the partner is called once per claim, except where a kill fell between a call and
  its commit: that copy comes back and is called again. Those are counted and
  printed, and bounded: at most prefetch × kills (what a killed process can have in
  flight). Re-sent copies and redeliveries never make a second call (the in-flight
  guard makes a twin wait, then the ledger finds it a duplicate);
- a kill leaves no lease that blocks a message: the run drains (the killed session's
  advisory locks go with it).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import psycopg
import pytest

from mq_support import claim_doc, cli, consumers, partner, queues, wait_for, write_claims

pytestmark = [pytest.mark.broker, pytest.mark.pg, pytest.mark.slow]

N = 2000
RESENT = 600
CONSUMERS = 4
KILLS = 2
PREFETCH = 20
DELAY = 0.03  # each call at the stub: keeps ~PREFETCH calls in flight per consumer


class Proc:
    """One consumer process, its output in files (a pipe nobody reads could fill up)."""

    def __init__(self, amqp_url: str, claim: str, db: str, tmp: Path, n: int) -> None:
        self.out_path, self.err_path = tmp / f"c{n}.out", tmp / f"c{n}.err"
        self._out: IO[str] = self.out_path.open("w")
        self._err: IO[str] = self.err_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "onceq", "mq", "consume", "--claim", claim, "--db", db,
             "--prefetch", str(PREFETCH), "--json"],
            stdout=self._out, stderr=self._err, text=True,
            env={**os.environ, "EAI_AMQP_URL": amqp_url},
        )  # fmt: skip

    def finish(self, sig: int) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=60)
        finally:
            self._out.close()
            self._err.close()


def recorded(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            row = conn.execute("SELECT count(*) FROM onceq.messages").fetchone()
        except psycopg.errors.UndefinedTable:
            return 0
    return int(row[0]) if row else 0


def test_four_consumers_two_killed_every_claim_once(
    amqp_url: str, pg_url: str, tmp_path: Path
) -> None:
    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    print(f"\nseed {seed}")
    guids = [f"mc-{i:04d}" for i in range(N)]
    r = cli(amqp_url, "mq", "topology")
    assert r.returncode == 0, r.stderr
    batches = [
        write_claims(tmp_path / f"b{k}", [claim_doc(g) for g in guids[k::4]]) for k in range(4)
    ]
    resent = write_claims(tmp_path / "re", [claim_doc(g) for g in rnd.sample(guids, RESENT)])
    kill_at = sorted(rnd.sample(range(int(N * 0.15), int(N * 0.85)), KILLS))
    killed: list[tuple[int, int]] = []  # (consumer slot, ledger rows when killed)
    published: list[str] = []
    t0 = time.monotonic()
    with partner(DELAY) as p:
        procs = [Proc(amqp_url, p.url, pg_url, tmp_path, n) for n in range(CONSUMERS)]
        try:
            wait_for(lambda: consumers(amqp_url) == CONSUMERS, 60)

            def publish() -> None:  # while they run: the claims, then the re-sent copies
                for files in (*batches, resent):
                    done = cli(amqp_url, "mq", "publish", *map(str, files))
                    published.append("ok" if done.returncode == 0 else done.stderr)

            publisher = threading.Thread(target=publish, daemon=True)
            publisher.start()
            for n, at in enumerate(kill_at):
                wait_for(lambda at=at: recorded(pg_url) >= at, 60, step=0.01)  # type: ignore[misc]
                slot = rnd.randrange(CONSUMERS)
                victim = procs[slot]
                victim.proc.kill()  # SIGKILL: its calls in flight are not committed
                assert victim.finish(signal.SIGKILL) == -signal.SIGKILL
                killed.append((slot, recorded(pg_url)))
                procs[slot] = Proc(amqp_url, p.url, pg_url, tmp_path, CONSUMERS + n)
            publisher.join(timeout=60)
            assert published == ["ok"] * 5, published
            wait_for(lambda: recorded(pg_url) == N, 60)
            wait_for(lambda: all(v == (0, 0) for v in queues(amqp_url, exact=True).values()), 60)
            took = time.monotonic() - t0
            codes = [c.finish(signal.SIGTERM) for c in procs]
        finally:
            for c in procs:
                if c.proc.poll() is None:
                    c.proc.kill()
                    c.finish(signal.SIGKILL)
        stats = p.stats()
    errs = [c.err_path.read_text() for c in procs]
    assert codes == [0] * CONSUMERS, errs
    summaries = [json.loads(c.out_path.read_text()) for c in procs]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute("SELECT msg_id FROM onceq.messages ORDER BY 1")]
        dead = conn.execute("SELECT count(*) FROM onceq.failures").fetchone()
    # Every claim recorded exactly once, none failed, nothing left anywhere.
    assert ids == guids and dead == (0,)
    assert all(v == (0, 0) for v in queues(amqp_url, exact=True).values()), queues(
        amqp_url, exact=True
    )
    # Partner calls: once per claim, but for the kills' windows (call made, not committed).
    calls = stats["by_guid"]
    assert sorted(calls) == guids
    twice = {g: c for g, c in calls.items() if c > 1}
    excess = sum(c - 1 for c in twice.values())
    print(
        f"{N} claims + {RESENT} re-sent, {CONSUMERS} consumers, kills at {killed} rows:"
        f" drained in {took:.1f}s; partner calls {sum(calls.values())},"
        f" claims called more than once {len(twice)} (excess calls {excess},"
        f" bound prefetch×kills = {PREFETCH * KILLS})"
    )
    assert excess <= PREFETCH * KILLS, twice
    # The survivors saw re-sent copies as duplicates (no call), not as new work.
    assert sum(s["duplicates"] for s in summaries) > 0
    assert sum(s["dead"] for s in summaries) == 0
