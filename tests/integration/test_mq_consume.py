"""`onceq mq consume` as a real process against the real broker and the real stub."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from mq_support import (
    CLAIMS,
    broker_state,
    claim_doc,
    consume,
    consume_until,
    consumer_prefetch,
    consumers,
    count,
    get_all,
    partner,
    publish,
    queues,
    rows,
    start_consumer,
    topology,
    wait_for,
    write_claims,
)

pytestmark = pytest.mark.broker

GUID = {p.stem: json.loads(p.read_bytes())["guid"] for p in CLAIMS.glob("*.json")}
NODOCS, BUSY, RESENT = GUID["claim-007-nodocs"], GUID["claim-008-busy"], GUID["claim-002"]


def test_sample_run_follows_the_settle_table(amqp_url: str, tmp_path: Path) -> None:
    topology(amqp_url)
    publish(amqp_url, *sorted(CLAIMS.glob("*.json")))
    db = tmp_path / "processed.db"
    with partner() as p:
        # 6 processed, 1 duplicate, 3 failure rows (422 dead; 503 requeued, then dead).
        r = consume_until(amqp_url, p.url, db, lambda: _ledger(db) == (6, 1, 3))
        stats = p.stats()
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    # Every call carried Idempotency-Key = the message_id (= the claim's guid).
    assert stats["by_key"] == stats["by_guid"] and stats["key_mismatch"] == 0

    # 422 → exactly one call, dead at once, reason recorded.
    assert stats["by_guid"][NODOCS] == 1
    assert rows(db, "SELECT reason, attempt, action FROM failures WHERE msg_id=?", NODOCS) == [
        ("http-422", 1, "dead")
    ]
    # BUSY (503) → requeued once, called twice, then dead with attempt 2.
    assert stats["by_guid"][BUSY] == 2
    assert rows(
        db, "SELECT reason, attempt, action FROM failures WHERE msg_id=? ORDER BY id", BUSY
    ) == [("http-503", 1, "requeue"), ("http-503", 2, "dead")]
    # The re-sent copy of claim-002 → one call, one processed row, one duplicate sighting.
    assert stats["by_guid"][RESENT] == 1
    assert rows(db, "SELECT count(*) FROM duplicates WHERE msg_id=?", RESENT) == [(1,)]
    # Every normal claim once; the ledger holds exactly the six accepted claims.
    normal = {GUID[f"claim-00{i}"] for i in range(1, 7)}
    assert all(stats["by_guid"][g] == 1 for g in normal)
    assert {r[0] for r in rows(db, "SELECT msg_id FROM processed WHERE source='amqp'")} == normal
    # Broker side: claim.in drained and acked; the two dead letters sit in claim.dead.
    assert queues(amqp_url) == {"claim.in": (0, 0), "claim.dead": (2, 0)}
    dead = {
        props.message_id: props.headers["x-death"][0]
        for _, props, _ in get_all(amqp_url, "claim.dead")
    }
    assert set(dead) == {NODOCS, BUSY}
    assert all(d["reason"] == "rejected" and d["queue"] == "claim.in" for d in dead.values())
    # The summary says the same.
    assert summary["processed"] == 6 and summary["duplicates"] == 1
    assert summary["dead"] == 2 and summary["requeued"] == 1
    # reasons: the dead letters only (one each); the retry is counted apart.
    assert summary["reasons"] == {"http-422": 1, "http-503": 1}
    assert summary["requeued_reasons"] == {"http-503": 1}
    assert summary["all_failed"] is False


def _ledger(db: Path) -> tuple[int, int, int]:
    return count(db, "processed"), count(db, "duplicates"), count(db, "failures")


def test_restarted_consumer_does_not_call_again_for_processed_ids(
    amqp_url: str, tmp_path: Path
) -> None:
    topology(amqp_url)
    files = write_claims(tmp_path / "c", [claim_doc(f"r-{i}") for i in range(5)])
    db = tmp_path / "processed.db"
    with partner() as p:
        publish(amqp_url, *files)
        first = consume_until(amqp_url, p.url, db, lambda: _ledger(db) == (5, 0, 0))
        assert first.returncode == 0, first.stderr
        assert p.stats()["total"] == 5
        publish(amqp_url, *files)  # the producer sends them all again
        second = consume_until(amqp_url, p.url, db, lambda: _ledger(db) == (5, 5, 0))
        assert second.returncode == 0, second.stderr
        assert p.stats()["total"] == 5  # no new call
    summary = json.loads(second.stdout)
    assert summary["duplicates"] == 5 and summary["processed"] == 0
    assert queues(amqp_url)["claim.in"] == (0, 0)


def test_db_defaults_to_eai_mq_db(amqp_url: str, tmp_path: Path) -> None:
    topology(amqp_url)
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc("e-1")]))
    db = tmp_path / "env.db"
    with partner() as p:
        r = consume_until(
            amqp_url, p.url, None, lambda: count(db, "processed") == 1, env={"EAI_MQ_DB": str(db)}
        )
    assert r.returncode == 0, r.stderr
    assert rows(db, "SELECT msg_id FROM processed") == [("e-1",)]


def test_in_flight_duplicates_call_the_claim_system_once(amqp_url: str, tmp_path: Path) -> None:
    """Two copies back to back reach the consumer together (prefetch 5): the first
    copy's call is held at the stub until the broker shows both delivered, so the
    second copy certainly arrives while the first is in flight."""
    topology(amqp_url)
    files = write_claims(tmp_path / "c", [claim_doc("twin"), claim_doc("twin")])
    publish(amqp_url, *files)
    db = tmp_path / "processed.db"
    with partner() as p:
        p.hold()
        proc = start_consumer(amqp_url, p.url, db, "--prefetch", "5", "--timeout", "60")
        wait_for(lambda: p.held() == 1, timeout=30)
        wait_for(lambda: queues(amqp_url)["claim.in"] == (2, 2), timeout=30, step=0.2)
        assert p.stats()["total"] == 1  # the second copy waits for the first's outcome
        p.release()
        wait_for(lambda: count(db, "duplicates") == 1, timeout=30)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        stats = p.stats()
    assert proc.returncode == 0, err
    assert stats["by_guid"] == {"twin": 1} and stats["by_key"] == {"twin": 1}
    assert json.loads(out)["duplicates"] == 1
    assert queues(amqp_url)["claim.in"] == (0, 0)


def test_prefetch_bounds_unacked_and_is_used_concurrently(amqp_url: str, tmp_path: Path) -> None:
    prefetch, n = 5, 40
    topology(amqp_url)
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc(f"p-{i}") for i in range(n)]))
    db = tmp_path / "processed.db"
    with partner() as p:
        p.hold()
        proc = start_consumer(amqp_url, p.url, db, "--prefetch", str(prefetch), "--timeout", "60")
        try:
            # prefetch calls at once: the bound is reached, deliveries really overlap.
            wait_for(lambda: p.held() == prefetch, timeout=30)
            # None of them can end, so nothing is acked: the broker's own counts show
            # exactly prefetch deliveries out, the QoS it enforces, and no further call.
            assert consumer_prefetch(amqp_url) == [prefetch]
            assert queues(amqp_url)["claim.in"] == (n, prefetch)
            assert p.stats()["total"] == prefetch
            p.release()
            wait_for(lambda: count(db, "processed") == n, timeout=60)
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=60)
        stats = p.stats()
    assert proc.returncode == 0, err
    assert stats["total"] == n
    assert stats["peak_in_flight"] == prefetch


@pytest.mark.parametrize(
    ("stub", "reason"),
    [("refused", "connect-error"), ("never answers", "timeout")],
)
def test_transient_transport_failures_retry_once_then_dead(
    amqp_url: str, tmp_path: Path, stub: str, reason: str
) -> None:
    topology(amqp_url)
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc("t-1")]))
    db = tmp_path / "processed.db"

    def dead() -> bool:
        return count(db, "failures") == 2

    if stub == "refused":
        from support import free_port

        r = consume_until(amqp_url, f"http://127.0.0.1:{free_port()}", db, dead)
    else:
        with partner() as p:
            p.hold()  # the stub takes each call and never answers: the timeout is certain
            r = consume_until(amqp_url, p.url, db, dead, "--timeout", "0.5")
            assert p.stats()["by_guid"] == {"t-1": 2}
            p.release()
    assert r.returncode == 0, r.stderr
    got = rows(db, "SELECT reason, attempt, action FROM failures ORDER BY id")
    assert got == [(reason, 1, "requeue"), (reason, 2, "dead")]
    assert queues(amqp_url) == {"claim.in": (0, 0), "claim.dead": (1, 0)}


def test_missing_queue_is_not_found(amqp_url: str, tmp_path: Path) -> None:
    r = consume(amqp_url, "http://127.0.0.1:9", tmp_path / "db", "--max-seconds", "1")
    assert r.returncode == 3, r.stderr
    assert "claim.in" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    # The consumer declares passively: it creates no queue (with guessed attributes),
    # and a refused run leaves no ledger.
    assert broker_state(amqp_url) == {"exchanges": [], "queues": [], "bindings": []}
    assert not (tmp_path / "db").exists()


def test_two_consumer_processes_share_one_ledger_each_claim_once(
    amqp_url: str, tmp_path: Path
) -> None:
    """Two real processes on one queue and one SQLite file: every claim is called and
    recorded exactly once, both take part, and neither hits 'database is locked'."""
    n, prefetch = 400, 20
    topology(amqp_url)
    files = write_claims(tmp_path / "c", [claim_doc(f"two-{i}") for i in range(n)])
    db = tmp_path / "processed.db"
    with partner() as p:
        procs = [
            start_consumer(amqp_url, p.url, db, "--prefetch", str(prefetch), "--timeout", "60")
            for _ in range(2)
        ]
        try:
            wait_for(lambda: consumers(amqp_url) == 2, timeout=30, step=0.2)
            p.hold()
            publish(amqp_url, *files)
            # 2 x prefetch calls held at once: more than one consumer may have out, so
            # both take part, by construction (each will record the calls it holds).
            wait_for(lambda: p.held() == 2 * prefetch, timeout=30)
            p.release()
            wait_for(lambda: count(db, "processed") == n, timeout=60)
        finally:
            for proc in procs:
                proc.terminate()
            outs = [proc.communicate(timeout=60) for proc in procs]
        stats = p.stats()
    for proc, (_, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err
        assert "locked" not in err and "Traceback" not in err
    summaries = [json.loads(out) for out, _ in outs]
    assert all(s["processed"] >= prefetch for s in summaries), summaries  # both consumed
    assert sum(s["processed"] for s in summaries) == n
    assert stats["total"] == n and set(stats["by_guid"].values()) == {1}
    assert rows(db, "SELECT count(*), count(DISTINCT msg_id) FROM processed") == [(n, n)]
    assert queues(amqp_url)["claim.in"] == (0, 0)
