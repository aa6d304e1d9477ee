"""Faults on a running consumer: SIGTERM / SIGINT mid-run, a connection the broker drops."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from mq_support import (
    claim_doc,
    ctl,
    partner,
    publish,
    queues,
    rows,
    start_consumer,
    topology,
    vhost,
    wait_for,
    write_claims,
)

pytestmark = pytest.mark.broker


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_mid_run_exits_0_and_loses_nothing(
    amqp_url: str, tmp_path: Path, sig: signal.Signals
) -> None:
    n = 30
    topology(amqp_url)
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc(f"s-{i}") for i in range(n)]))
    db = tmp_path / "processed.db"
    with partner(delay=0.5) as p:
        proc = start_consumer(amqp_url, p.url, db, "--prefetch", "5")
        wait_for(lambda: p.stats()["total"] >= 7, timeout=15)  # calls are in flight now
        t0 = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=15)
        took = time.monotonic() - t0
        stats = p.stats()
    assert proc.returncode == 0, err
    assert took < 5, took  # in-flight calls (0.5 s each) finish, nothing more is taken
    summary = json.loads(out)
    done = {r[0] for r in rows(db, "SELECT msg_id FROM processed")}
    ready, unacked = queues(amqp_url)["claim.in"]
    assert unacked == 0
    # Nothing lost: every message is either recorded (and acked) or back in claim.in.
    assert len(done) + ready == n
    assert 7 <= len(done) < n
    # Nothing called twice, and every call that answered 201 was recorded.
    assert set(stats["by_guid"].values()) == {1}
    assert set(stats["by_guid"]) == done
    assert summary["processed"] == len(done)


def _connections(url: str) -> list[str]:
    # The table form: its pids are what close_connection accepts (JSON's "#PID<…>" is not).
    lines = ctl("list_connections", "pid", "vhost").splitlines()
    return [pid for pid, v in (ln.split("\t") for ln in lines if "\t" in ln) if v == vhost(url)]


def test_dropped_connection_reconnects_and_finishes_each_claim_once(
    amqp_url: str, tmp_path: Path
) -> None:
    n = 30
    topology(amqp_url)
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc(f"d-{i}") for i in range(n)]))
    db = tmp_path / "processed.db"
    with partner(delay=0.3) as p:
        proc = start_consumer(amqp_url, p.url, db, "--prefetch", "5", "--max-seconds", "9")
        wait_for(lambda: p.stats()["total"] >= 6, timeout=15)
        pids = _connections(amqp_url)
        assert len(pids) == 1, pids
        # The broker drops the consumer's connection while calls are in flight.
        ctl("close_connection", pids[0], "onceq test: dropped on purpose")
        wait_for(lambda: _connections(amqp_url) not in ([], pids), timeout=10, step=0.3)
        out, err = proc.communicate(timeout=30)
        stats = p.stats()
    assert proc.returncode == 0, err
    assert stats["total"] == n, stats  # each guid called exactly once …
    assert set(stats["by_guid"].values()) == {1}
    assert rows(db, "SELECT count(*) FROM processed") == [(n,)]  # … recorded …
    assert queues(amqp_url)["claim.in"] == (0, 0)  # … and acked
    assert "Traceback" not in err
    summary = json.loads(out)
    assert summary["processed"] == n
    # Calls were in flight when the channel died: their acks failed (a warning, not a
    # crash), and the copies the broker redelivered were acked as already done.
    assert summary["unsettled"] >= 1 and "could not ack" in err
    assert summary["duplicates"] >= summary["unsettled"]
