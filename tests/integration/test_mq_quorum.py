"""Quorum topologies and the consumer's start-up checks, against the real broker.

The broker's own view (rabbitmqctl list_queues type arguments) is the oracle for what
`mq topology --queue-type quorum` declared; a real `mq consume` and `mq dead` run on it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from pathlib import Path

import pytest

from mq_dead_support import busy, consume_exercise, ids_in, rejected, run_dead
from mq_support import (
    broker_state,
    claim_doc,
    cli,
    count,
    ctl,
    partner,
    publish,
    queues,
    rows,
    start_consumer,
    vhost,
    wait_for,
    write_claims,
)
from onceq._sources.amqp.topology_types import DELIVERY_LIMIT

pytestmark = pytest.mark.broker

QUORUM_WORK = {
    "x-queue-type": "quorum",
    "x-dead-letter-exchange": "eai.dlx",
    "x-dead-letter-routing-key": "claim.dead",
    "x-dead-letter-strategy": "at-least-once",
    "x-overflow": "reject-publish",
    "x-delivery-limit": DELIVERY_LIMIT,
}


def _held(url: str) -> dict[str, tuple[str, dict]]:
    """{queue: (type, arguments)} as the broker holds them."""
    out = ctl("list_queues", "-p", vhost(url), "name", "type", "arguments", "--formatter", "json")
    return {q["name"]: (q["type"], {a[0]: a[2] for a in q["arguments"]}) for q in json.loads(out)}


def _declare_by_hand(url: str, queue: str, arguments: dict) -> None:
    """A work queue declared by another tool, and a message waiting in it."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()  # in the queue before the consumer starts
        ch.queue_declare(queue, durable=True, arguments=arguments)
        ch.basic_publish("", queue, json.dumps(claim_doc("waiting")).encode(),
                         pika.BasicProperties(message_id="waiting", delivery_mode=2))  # fmt: skip
    finally:
        conn.close()


def _ready(url: str, queue: str) -> int:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        conn.close()


def test_quorum_topology_is_what_the_broker_holds_and_a_redeclare_changes_nothing(
    amqp_url: str,
) -> None:
    r = cli(amqp_url, "mq", "topology", "--queue-type", "quorum", "--retry-delays", "1s", "--json")
    assert r.returncode == 0, r.stderr
    held = _held(amqp_url)
    assert held == {
        "claim.in": ("quorum", QUORUM_WORK),
        "claim.dead": ("quorum", {"x-queue-type": "quorum", "x-delivery-limit": DELIVERY_LIMIT}),
        "claim.retry.1s": (
            "quorum",
            {
                "x-queue-type": "quorum",
                "x-message-ttl": 1000,
                "x-dead-letter-exchange": "",  # the default exchange
                "x-dead-letter-routing-key": "claim.in",
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
            },
        ),
    }
    again = cli(amqp_url, "mq", "topology", "--queue-type", "quorum", "--retry-delays", "1s")
    assert again.returncode == 0 and again.stdout.strip().endswith("0 created"), again.stdout
    # The classic topology over it: the broker refuses, one line, nothing changed.
    before = broker_state(amqp_url)
    classic = cli(amqp_url, "mq", "topology", "--retry-delays", "1s")
    assert classic.returncode == 4 and classic.stderr.count("\n") == 1, classic.stderr
    assert "queue claim.in" in classic.stderr
    assert broker_state(amqp_url) == before


def test_a_quorum_flow_requeues_delays_and_dead_letters_losing_nothing(
    amqp_url: str, tmp_path: Path
) -> None:
    r = cli(amqp_url, "mq", "topology", "--queue-type", "quorum", "--retry-delays", "1s")
    assert r.returncode == 0, r.stderr
    ok = [claim_doc(f"ok-{i}") for i in range(6)]
    publish(amqp_url, *write_claims(tmp_path / "c", [*ok, rejected("rej-0"), busy("busy-0")]))
    db = tmp_path / "q.db"
    with partner() as stub:
        # The default policy shape, short: 1 immediate retry, one 1 s tier, then dead.
        out = cli(amqp_url, "mq", "consume", "--claim", stub.url, "--db", str(db), "--json",
                  "--until-empty", "--no-breaker", "--retry-delays", "1s")  # fmt: skip
        assert out.returncode == 0, out.stderr
        by_guid = stub.stats()["by_guid"]
    summary = json.loads(out.stdout)
    assert summary["drained"] is True and summary["processed"] == 6
    assert all(by_guid[d["guid"]] == 1 for d in ok)
    # busy-0: attempt 1 requeued (a return on the quorum queue), attempt 2 copied into
    # the 1 s quorum tier and back, attempt 3 dead; its three calls are the three rows.
    assert by_guid["busy-0"] == 3
    assert rows(db, "SELECT attempt, action FROM failures WHERE msg_id='busy-0' ORDER BY id") == [
        (1, "requeue"),
        (2, "delay"),
        (3, "dead"),
    ]
    assert count(db, "messages") == 6
    # At-least-once dead-lettering moves them after the reject: wait for the transfer.
    wait_for(lambda: queues(amqp_url)["claim.dead"] == (2, 0), 30)
    assert sorted(ids_in(amqp_url, "claim.dead")) == ["busy-0", "rej-0"]
    # A passive declare counts (list_queues' figures for a quorum queue lag behind).
    assert _ready(amqp_url, "claim.in") == 0 and _ready(amqp_url, "claim.retry.1s") == 0


def test_dead_letters_on_quorum_are_browsed_in_order_replayed_and_purged(
    amqp_url: str, tmp_path: Path
) -> None:
    """Browsing (basic.get, then every letter handed back) is a return per letter on a
    quorum queue. Forty letters: nothing is lost and every letter stays listed. The
    ORDER is not kept: RabbitMQ 3.10.8 hands more than ~32 returned letters back out of
    order (measured; docs/mq.md), so a list's positions hold for that list only."""
    r = cli(amqp_url, "mq", "topology", "--queue-type", "quorum", "--retry", "exercise")
    assert r.returncode == 0, r.stderr
    guids = [f"rej-{i:02d}" for i in range(40)]
    publish(amqp_url, *write_claims(tmp_path / "c", [rejected(g) for g in guids]))
    db = tmp_path / "d.db"
    with partner() as stub:
        consume_exercise(amqp_url, stub.url, db)
    wait_for(lambda: queues(amqp_url)["claim.dead"] == (40, 0), 30)

    def listed(n: int = 40) -> list[str]:
        # The previous browse's returns are the queue's to process after its channel
        # closed: a list counts the queue when it starts, so wait for all n first.
        wait_for(lambda: _ready(amqp_url, "claim.dead") == n, 30)
        done = run_dead(amqp_url, "list", "--db", str(db), "--json")
        assert done.returncode == 0, done.stderr
        return [x["message_id"] for x in json.loads(done.stdout)["letters"]]

    for _ in range(3):
        assert sorted(listed()) == guids
    assert _ready(amqp_url, "claim.dead") == 40
    rep = run_dead(amqp_url, "replay", "--id", "rej-07", "--db", str(db), "--json")
    assert rep.returncode == 0 and json.loads(rep.stdout)["done"] == 1, rep.stderr
    assert ids_in(amqp_url, "claim.in") == ["rej-07"]
    assert sorted(listed(39)) == [g for g in guids if g != "rej-07"]
    wait_for(lambda: _ready(amqp_url, "claim.dead") == 39, 30)
    pur = run_dead(amqp_url, "purge", "--all", "--yes", "--db", str(db), "--json")
    assert pur.returncode == 0 and json.loads(pur.stdout)["done"] == 39, pur.stderr
    # Once right after a purge that reported all 39 done, 6 were still counted (1 run in
    # ~10; again in a fresh-clone run beside the whole suite, after 15 s): wait for the
    # count, and a letter that stays fails, saying how many stayed.
    left: list[int] = []

    def emptied() -> bool:
        left.append(_ready(amqp_url, "claim.dead"))
        return left[-1] == 0

    try:
        wait_for(emptied, 30, step=0.2)
    except AssertionError:
        # Which letters stayed, and whether the purge's audit named them: a letter the
        # audit lists but the queue still holds is a purge that acked less than it said.
        stayed = _browse_ids(amqp_url, "claim.dead")
        raise AssertionError(
            f"claim.dead still counts {left[-1]} after the purge: {stayed}, "
            f"report {json.loads(pur.stdout)}"
        ) from None


def _browse_ids(url: str, queue: str) -> list[tuple[str | None, bool]]:
    """(message_id, redelivered) of every letter, each handed back when the channel closes."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch, seen = conn.channel(), []
        while True:
            method, props, _ = ch.basic_get(queue, auto_ack=False)
            if method is None:
                return seen
            seen.append((props.message_id, bool(method.redelivered)))
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("arguments", "why"),
    [
        ({}, "has no x-dead-letter-exchange (onceq expects 'eai.dlx')"),
        ({"x-queue-type": "quorum"}, "has no x-dead-letter-exchange (onceq expects 'eai.dlx')"),
        (
            {"x-queue-type": "quorum", "x-dead-letter-exchange": "eai.dlx"},
            "has no x-dead-letter-routing-key (onceq expects 'claim.dead')",
        ),
        (
            {"x-dead-letter-exchange": "other.dlx", "x-dead-letter-routing-key": "claim.dead"},
            "has x-dead-letter-exchange 'other.dlx', onceq expects 'eai.dlx'",
        ),
    ],
    ids=["classic-none", "quorum-none", "quorum-no-key", "classic-other"],
)
def test_the_start_up_check_refuses_a_work_queue_without_its_dead_letter_arguments(
    amqp_url: str, tmp_path: Path, arguments: dict, why: str
) -> None:
    _declare_by_hand(amqp_url, "claim.in", arguments)
    before = broker_state(amqp_url)
    db = tmp_path / "never.db"
    with partner() as stub:
        r = cli(amqp_url, "mq", "consume", "--claim", stub.url, "--db", str(db),
                "--retry", "exercise", "--until-empty")  # fmt: skip
        assert stub.stats()["by_guid"] == {}  # nothing called
    assert r.returncode == 4, (r.returncode, r.stderr)
    [line] = r.stderr.splitlines()
    assert line.startswith(f"onceq: queue claim.in: {why}, so a message onceq gives up on"), line
    assert line.endswith("then run: onceq mq topology --retry-delays none"), line
    # Nothing consumed, nothing created, no ledger. (A passive declare counts: the
    # broker's list_queues figures for a quorum queue lag behind.)
    assert _ready(amqp_url, "claim.in") == 1
    assert broker_state(amqp_url) == before and not db.exists()


def test_a_work_queue_with_more_arguments_than_onceqs_passes_the_check(
    amqp_url: str, tmp_path: Path
) -> None:
    """The check learns the arguments the broker compares (here x-max-length and a
    non-default type) instead of demanding onceq's exact set."""
    _declare_by_hand(amqp_url, "claim.in", {
        "x-queue-type": "quorum", "x-max-length": 1000,
        "x-dead-letter-exchange": "eai.dlx", "x-dead-letter-routing-key": "claim.dead",
    })  # fmt: skip
    db = tmp_path / "ok.db"
    with partner() as stub:
        r = cli(amqp_url, "mq", "consume", "--claim", stub.url, "--db", str(db), "--json",
                "--retry", "exercise", "--until-empty")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["processed"] == 1 and count(db, "messages") == 1


def test_a_call_longer_than_the_brokers_consumer_timeout_is_warned_once(
    amqp_url: str, tmp_path: Path
) -> None:
    """The broker's default consumer_timeout is 30 min; a 1 h call timeout exceeds it."""
    r = cli(amqp_url, "mq", "topology", "--retry", "exercise")
    assert r.returncode == 0, r.stderr
    proc = start_consumer(amqp_url, "http://127.0.0.1:1", tmp_path / "t.db", "--timeout", "3600")
    try:
        assert proc.stderr is not None
        line = ""
        while "consumer_timeout" not in line:  # the check runs beside the consumer
            line = proc.stderr.readline()
            assert line, "the consumer ended without the warning"
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "WARNING" in line and "the broker's consumer_timeout is 1800s" in line
    assert "3600s call timeout + 60s" in line and "consumer_timeout" not in rest
    assert proc.returncode == 0


def test_the_consumer_timeout_check_reads_the_real_broker(amqp_url: str) -> None:
    from onceq._sources.amqp.preflight import check_consumer_timeout

    assert asyncio.run(check_consumer_timeout(amqp_url, "claim.in", 10.0, None)) == ""
    warned = asyncio.run(check_consumer_timeout(amqp_url, "claim.in", 7200.0, None))
    assert warned.startswith("the broker's consumer_timeout is 1800s")


def test_without_rabbitmqctl_the_check_says_nothing_but_one_debug_line(
    amqp_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The same broker, the same 2 h call, but no way to read the setting: no warning."""
    from onceq._sources.amqp import preflight

    monkeypatch.setattr(preflight.shutil, "which", lambda _name: None)
    caplog.set_level(logging.DEBUG, logger="onceq.amqp.preflight")
    assert asyncio.run(preflight.check_consumer_timeout(amqp_url, "claim.in", 7200.0, None)) == ""
    [record] = caplog.records
    assert record.levelno == logging.DEBUG and "guest:guest" not in record.getMessage()


FLOWS = """\
ledger = "ledger.db"

[flows.payments]
source = "rabbitmq"
queue = "pay"
dead_letter_queue = "pay.graveyard"
queue_type = "quorum"
retry = { delays = ["2s"] }

[flows.invoices]
source = "rabbitmq"
queue = "invoice.in"
retry = "exercise"
"""


def test_a_flow_files_queue_type_is_declared_per_flow(amqp_url: str, tmp_path: Path) -> None:
    flows = tmp_path / "flows.toml"
    flows.write_text(FLOWS)
    r = cli(amqp_url, "mq", "topology", "--flows", str(flows))
    assert r.returncode == 0, r.stderr
    held = _held(amqp_url)
    assert {q: t for q, (t, _a) in held.items()} == {
        "pay": "quorum",
        "pay.graveyard": "quorum",
        "pay.retry.2s": "quorum",
        "invoice.in": "classic",
        "invoice.dead": "classic",
    }
    assert held["pay"][1]["x-dead-letter-routing-key"] == "pay.graveyard"
    # --queue-type is the flow file's to say.
    both = cli(amqp_url, "mq", "topology", "--flows", str(flows), "--queue-type", "quorum")
    assert both.returncode == 2 and "queue_type comes from the flow file" in both.stderr
    # A mistaken type is named by its key by `onceq check`, before any broker.
    flows.write_text(FLOWS.replace('queue_type = "quorum"', 'queue_type = "replicated"'))
    bad = cli(amqp_url, "check", str(flows))
    assert bad.returncode == 2, bad.stderr
    [line] = bad.stderr.splitlines()
    assert line.endswith("flows.payments.queue_type: 'replicated': must be 'classic' or 'quorum'")


def test_a_user_who_may_not_declare_gets_one_warning_and_the_run_goes_on(
    amqp_url: str, tmp_path: Path
) -> None:
    """Reading the arguments needs `configure` on the queue (it declares): without it,
    403, and the check is skipped with one warning instead of refusing a working run."""
    import uuid

    r = cli(amqp_url, "mq", "topology", "--retry", "exercise")
    assert r.returncode == 0, r.stderr
    user = f"onceq-h4-{uuid.uuid4().hex[:8]}"
    ctl("add_user", user, "pw")
    try:
        ctl("set_permissions", "-p", vhost(amqp_url), user, "^$", ".*", ".*")
        limited = amqp_url.replace("guest:guest@", f"{user}:pw@")
        with partner() as stub:
            out = cli(limited, "mq", "consume", "--claim", stub.url, "--db",
                      str(tmp_path / "l.db"), "--retry", "exercise", "--until-empty")  # fmt: skip
    finally:
        ctl("delete_user", user)
    assert out.returncode == 0, out.stderr
    [line] = [x for x in out.stderr.splitlines() if "WARNING" in x]
    assert "queue claim.in: its dead-letter arguments were not checked" in line
    assert "pw@" not in out.stderr
