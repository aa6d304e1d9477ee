"""Delayed retries on RabbitMQ: the tier queues, as a real `onceq mq consume` uses them.

The claim system here is scripted per guid (tests/mq_stub.py): "503, 503, then 201"
and the time of every call, which the partner stub cannot say.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from mq_stub import Script, scripted_partner
from mq_support import (
    broker_state,
    claim_doc,
    cli,
    consumers,
    count,
    get_all,
    queues,
    rows,
    start_consumer,
    wait_for,
    write_claims,
)

pytestmark = pytest.mark.broker

# How late a retry may come on a loaded 2-core machine: the TTL is the broker's, the
# rest is one redelivery and one HTTP call.
LATE = 1.5


def _setup(url: str, tmp: Path, docs: list[dict], *topology_args: str) -> None:
    r = cli(url, "mq", "topology", *topology_args)
    assert r.returncode == 0, r.stderr
    if docs:
        r = cli(url, "mq", "publish", *map(str, write_claims(tmp / "claims", docs)))
        assert r.returncode == 0, r.stderr


def _consume(url: str, base: str, db: Path, *args: str) -> dict:
    r = cli(url, "mq", "consume", "--claim", base, "--db", str(db), "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_two_transient_failures_then_success_wait_each_tier(amqp_url: str, tmp_path: Path) -> None:
    _setup(amqp_url, tmp_path, [claim_doc("g1"), claim_doc("ok")], "--retry-delays", "1s,2s")
    script = Script({"g1": [503, 503]})  # then 201
    db = tmp_path / "p.db"
    with scripted_partner(script) as base:
        summary = _consume(
            amqp_url, base, db, "--until-empty", "--retry-delays", "1s,2s",
            "--immediate-retries", "0",
        )  # fmt: skip
    times = script.times("g1")
    assert len(times) == 3 and script.count("ok") == 1
    first, second = times[1] - times[0], times[2] - times[1]
    # Each wait is its tier's TTL (never shorter: the copy sat in the queue), plus a
    # redelivery and a call.
    assert 1.0 <= first < 1.0 + LATE, first
    assert 2.0 <= second < 2.0 + LATE, second
    # The attempts are durable: the two failures say "delay", the third took effect.
    assert rows(
        db, "SELECT reason, attempt, action FROM failures WHERE msg_id='g1' ORDER BY id"
    ) == [
        ("http-503", 1, "delay"),
        ("http-503", 2, "delay"),
    ]
    assert count(db, "messages") == 2
    # --until-empty waited for the copies in the tiers: the batch ended drained, after
    # the third call, and every queue is empty.
    assert summary["drained"] is True and summary["processed"] == 2
    assert summary["requeued"] == 2 and summary["dead"] == 0
    assert set(queues(amqp_url).values()) == {(0, 0)}


def test_a_copy_waits_in_its_tier_with_the_messages_body_and_properties(
    amqp_url: str, tmp_path: Path
) -> None:
    doc = claim_doc("g1")
    _setup(amqp_url, tmp_path, [doc], "--retry-delays", "1m")
    original = get_all(amqp_url, "claim.in")[0]
    script = Script({}, default=503)
    db = tmp_path / "p.db"
    with scripted_partner(script) as base:
        proc = start_consumer(
            amqp_url, base, db, "--retry-delays", "1m", "--immediate-retries", "0"
        )
        try:
            wait_for(lambda: queues(amqp_url).get("claim.retry.1m", (0, 0))[0] == 1, 30)
            # Moved, not held: the original is acked once its copy is confirmed.
            wait_for(lambda: queues(amqp_url)["claim.in"] == (0, 0), 10)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=60)
    assert proc.returncode == 0
    [(_, props, body)] = get_all(amqp_url, "claim.retry.1m")
    assert body == original[2] and json.loads(body) == doc
    assert props.message_id == "g1" and props.content_type == "application/json"
    assert props.delivery_mode == 2  # persistent, like the original
    # The copy keeps the published copy's id: its redelivery is recognised across crashes.
    assert props.headers["x-onceq-copy"] == original[1].headers["x-onceq-copy"]
    assert "x-death" not in (props.headers or {})
    assert props.expiration is None  # the tier's TTL alone decides when it comes back
    assert rows(db, "SELECT attempt, action FROM failures") == [(1, "delay")]
    assert script.count("g1") == 1


def test_retry_after_picks_the_first_tier_at_least_that_long(amqp_url: str, tmp_path: Path) -> None:
    _setup(amqp_url, tmp_path, [claim_doc("g1")], "--retry-delays", "1s,2s,5s")
    # Without Retry-After the first failure would be an immediate retry (no wait).
    script = Script({"g1": [(503, {"Retry-After": "2"})]})
    db = tmp_path / "p.db"
    with scripted_partner(script) as base:
        summary = _consume(amqp_url, base, db, "--until-empty", "--retry-delays", "1s,2s,5s")
    times = script.times("g1")
    assert len(times) == 2 and summary["processed"] == 1
    # The 2s tier: not the immediate retry, not the 1s tier, not the 5s one.
    assert 2.0 <= times[1] - times[0] < 2.0 + LATE, times
    assert rows(db, "SELECT attempt, action FROM failures") == [(1, "delay")]


def test_a_consumer_whose_tiers_are_not_declared_exits_3_and_changes_nothing(
    amqp_url: str, tmp_path: Path
) -> None:
    # The exercise's topology (no tiers), then a consumer on the default policy.
    _setup(amqp_url, tmp_path, [claim_doc("g1")], "--retry", "exercise")
    before = broker_state(amqp_url)
    db = tmp_path / "p.db"
    r = cli(amqp_url, "mq", "consume", "--claim", "http://127.0.0.1:9", "--db", str(db))
    assert r.returncode == 3, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("onceq: ") and "claim.retry.5s" in line
    assert "declare it first: onceq mq topology" in line
    assert not db.exists() and broker_state(amqp_url) == before
    assert queues(amqp_url)["claim.in"] == (1, 0)
    # Other delays: the hint gives the flag that declares them.
    r = cli(amqp_url, "mq", "consume", "--claim", "http://127.0.0.1:9", "--db", str(db),
            "--queue", "claim.in", "--retry-delays", "1s,1m")  # fmt: skip
    assert r.returncode == 2  # --claim with --queue: a usage error first, nothing opened
    r = cli(amqp_url, "mq", "consume", "--claim", "http://127.0.0.1:9", "--db", str(db),
            "--retry-delays", "1s,1m")  # fmt: skip
    assert r.returncode == 3 and "onceq mq topology --retry-delays 1s,1m" in r.stderr
    assert not db.exists()


def test_a_delay_whose_tier_is_gone_is_given_back_never_lost(amqp_url: str, tmp_path: Path) -> None:
    _setup(amqp_url, tmp_path, [], "--retry-delays", "1m")
    script = Script({}, default=503)
    db = tmp_path / "p.db"
    with scripted_partner(script) as base:
        proc = start_consumer(
            amqp_url, base, db, "--retry-delays", "1m", "--immediate-retries", "0",
            "--no-breaker",
        )  # fmt: skip
        try:
            wait_for(lambda: consumers(amqp_url) == 1, 30)  # it checked its tier: there
            # Deleted behind the running consumer's back: the copy is returned.
            _delete_queue(amqp_url, "claim.retry.1m")
            r = cli(
                amqp_url,
                "mq",
                "publish",
                *map(str, write_claims(tmp_path / "c", [claim_doc("g1")])),
            )
            assert r.returncode == 0, r.stderr
            # 1st failure: DELAY, the copy is returned → the original goes back to
            # claim.in; 2nd (the last attempt of a 1-tier policy): dead.
            wait_for(lambda: queues(amqp_url)["claim.dead"][0] == 1, 30)
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert script.count("g1") == 2
    assert rows(db, "SELECT attempt, action FROM failures ORDER BY id") == [
        (1, "delay"),
        (2, "dead"),
    ]
    warning = [line for line in err.splitlines() if "claim.retry.1m" in line]
    assert warning and "not confirmed" in warning[0] and "onceq mq topology" in warning[0]
    assert queues(amqp_url)["claim.in"] == (0, 0)


def _delete_queue(url: str, queue: str) -> None:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        conn.channel().queue_delete(queue)
    finally:
        conn.close()
