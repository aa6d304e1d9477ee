"""Twins of one message in two consumer processes call the partner once (issue 9).

Two `onceq mq consume` processes on one ledger (a PostgreSQL database: advisory locks;
an SQLite file: byte-range locks on `<ledger>-inflight`) and one vhost; N claims,
each published twice in a row, so the broker hands the two copies of a claim to the
two processes (round robin) and both are in flight at once. The claim stub holds
every call until released: with the in-flight guard it holds exactly N calls (the
twin of each waits for the advisory lock in the other process), where without it it
would hold 2N. Released, every claim is recorded once, the twin found as a duplicate,
the stub called once per claim (by_guid), every call with its Idempotency-Key.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import psycopg
import pytest

from mq_support import (
    claim_doc,
    cli,
    consumers,
    count,
    partner,
    queues,
    rows,
    start_consumer,
    topology,
    wait_for,
    write_claims,
)

pytestmark = pytest.mark.broker

N = 20


def ledger_ids(target: str) -> list[str]:
    if not target.startswith("postgresql://"):
        if count(Path(target), "messages") == 0:
            return []
        return [r[0] for r in rows(Path(target), "SELECT msg_id FROM messages ORDER BY msg_id")]
    with psycopg.connect(target, autocommit=True) as conn:
        try:
            found = conn.execute("SELECT msg_id FROM onceq.messages ORDER BY msg_id").fetchall()
        except psycopg.errors.UndefinedTable:
            return []
    return [r[0] for r in found]


def test_twins_in_two_processes_call_the_partner_once(
    amqp_url: str, ledger_target: str, tmp_path: Path
) -> None:
    db = ledger_target
    topology(amqp_url)
    guids = [f"tw-{i:03d}" for i in range(N)]
    files = write_claims(tmp_path / "c", [claim_doc(g) for g in guids for _ in (0, 1)])
    with partner() as p:
        procs = [
            start_consumer(amqp_url, p.url, None, "--db", db, "--prefetch", str(2 * N))
            for _ in range(2)
        ]
        try:
            wait_for(lambda: consumers(amqp_url) == 2, 30)
            p.hold()
            r = cli(amqp_url, "mq", "publish", *map(str, files))
            assert r.returncode == 0, r.stderr
            # Every copy is in a consumer (2N unacked), and the stub holds one call per
            # claim: each twin waits for the other process's lease, not at the stub.
            wait_for(lambda: queues(amqp_url)["claim.in"] == (2 * N, 2 * N), 30)
            wait_for(lambda: p.held() >= N, 30)
            time.sleep(0.5)  # a twin that got past the guard would reach the stub now
            assert p.held() == N
            assert sorted(p.stats()["by_guid"]) == guids  # one of each, not one twice
            p.release()
            wait_for(lambda: len(ledger_ids(db)) == N, 30)
            wait_for(lambda: queues(amqp_url)["claim.in"] == (0, 0), 30)
            outs = []
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
                out, err = proc.communicate(timeout=60)
                assert proc.returncode == 0, err
                outs.append(json.loads(out))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        stats = p.stats()
    assert ledger_ids(db) == guids
    assert stats["by_guid"] == dict.fromkeys(guids, 1)
    assert sum(o["processed"] for o in outs) == N
    assert sum(o["duplicates"] for o in outs) == N
    # Both processes had copies while all 2N were unacked (above): the twins really were
    # in two processes at once. (Which wins each claim is the guard's batches' race.)
    assert all(o["received"] > 0 for o in outs), outs
    assert sum(o["received"] for o in outs) == 2 * N
