"""kill -9 of `onceq mq dead replay` at a random moment loses no message.

200 dead letters (claims the stub refuses with 422, dead-lettered by a real consumer).
Ten times: a replay --all (paced or not) is SIGKILLed at a random moment (eight times
at a moment inside the replay, twice at any moment from its start); then every
message is counted wherever it can be — the work queue, its retry tiers, the dead-letter
queue, the ledger's processed rows. A message may be in two places after a kill (its
copy confirmed, the dead copy not yet acked); none may be in none. Between runs a
consumer dead-letters the replayed copies again, so each run starts from 200 dead.
The seed is printed: a failing run can be repeated.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from mq_dead_support import consume_exercise, ids_in, make_dead, rejected, table
from mq_support import partner, queues, topology, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow]

N = 200
RUNS = 10


def everywhere(url: str, db: Path) -> Counter[str]:
    """Copies of each message_id in the flow's queues (work, tiers, dead) and the ledger."""
    found: Counter[str] = Counter()
    names = [
        q
        for q in queues(url, exact=True)
        if q == "claim.in" or q.startswith(("claim.retry.", "claim.dead"))
    ]
    for q in names:
        found.update(ids_in(url, q))
    found.update(r[0] for r in table(db, "SELECT msg_id FROM messages"))
    return found


def _ops(db: Path) -> int:
    return int(table(db, "SELECT count(*) FROM dead_ops")[0][0])


def test_kill_9_during_replay_loses_nothing(amqp_url: str, tmp_path: Path) -> None:
    seed = int(os.environ.get("ONCEQ_TEST_SEED", time.time_ns() % 1_000_000))
    print(f"seed {seed}")
    rng = random.Random(seed)
    topology(amqp_url)
    db = tmp_path / "processed.db"
    guids = [f"k{i:04d}" for i in range(N)]
    killed_mid_way = 0
    with partner() as stub:
        make_dead(amqp_url, tmp_path / "claims", stub.url, db, [rejected(g) for g in guids])
        assert Counter(ids_in(amqp_url, "claim.dead")) == Counter(guids)
        for run in range(RUNS):
            rate = rng.choice([None, 100.0, 200.0])
            args = ["--rate", str(rate)] if rate else []
            ops_before = _ops(db)
            proc = subprocess.Popen(
                [sys.executable, "-m", "onceq", "mq", "dead", "replay", "--all", "--db", str(db),
                 "--json", *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**os.environ, "EAI_AMQP_URL": amqp_url},
            )  # fmt: skip
            if run % 5 == 4:
                # Any moment from the start: before the first copy, during, or after.
                time.sleep(rng.uniform(0.0, 3.0))
            else:
                # A moment inside the replay: from its op's start in the ledger (just
                # before its first copy) to about when it would end.
                wait_for(lambda n=ops_before: _ops(db) > n, 60, step=0.005)
                time.sleep(rng.uniform(0.0, 0.3 if rate is None else N / rate))
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=60)
            # The broker requeues what the dead connection held unacked.
            wait_for(lambda: all(u == 0 for _m, u in queues(amqp_url, exact=True).values()), 30)
            found = everywhere(amqp_url, db)
            lost = [g for g in guids if found[g] == 0]
            assert not lost, f"seed {seed} run {run}: lost {lost[:5]} ({len(lost)})"
            assert set(found) == set(guids), f"seed {seed}: a message nobody published"
            in_work = len(ids_in(amqp_url, "claim.in"))
            twins = sum(found.values()) - N
            print(f"run {run}: rate {rate}, {in_work} in claim.in, {twins} in two places")
            last = table(db, "SELECT count, finished_at FROM dead_ops ORDER BY id DESC LIMIT 1")
            if last and last[0][0] > 0 and last[0][1] is None and _ops(db) > ops_before:
                killed_mid_way += 1  # inside a replay that had already moved some
            # Every dead row still counts as a failure until its reset is durable: the
            # ledger and the queues agree on which copies were replayed.
            consume_exercise(amqp_url, stub.url, db, prefetch=50)
            assert Counter(ids_in(amqp_url, "claim.in")) == Counter()
            assert set(ids_in(amqp_url, "claim.dead")) == set(guids)
        # Finally an uninterrupted replay moves every copy (twins included) back.
        r = subprocess.run(
            [sys.executable, "-m", "onceq", "mq", "dead", "replay", "--all", "--db", str(db),
             "--json"],
            capture_output=True,
            text=True,
            env={**os.environ, "EAI_AMQP_URL": amqp_url},
            timeout=120,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["left"] == 0 and doc["done"] == doc["total"] >= N
        assert set(ids_in(amqp_url, "claim.in")) == set(guids)
        # Each copy moved went through the ledger first: one replays row per copy.
        rows = table(db, "SELECT count(*) FROM replays WHERE op = ?", (doc["op"],))
        assert rows == [(doc["done"],)]
    print(f"seed {seed}: {killed_mid_way} of {RUNS} kills cut a replay half-way")
    # The kill is random; most runs must land inside a replay, or the test proves little.
    assert killed_mid_way >= 4, f"seed {seed}: only {killed_mid_way} kills mid-way"
