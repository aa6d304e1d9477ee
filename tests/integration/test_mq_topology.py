"""`onceq mq topology` and `onceq mq status` against the real broker, one vhost per test."""

from __future__ import annotations

import json
from pathlib import Path

import pika
import pytest

from mq_support import broker_state, cli, ctl, queues, vhost, wait_for

pytestmark = pytest.mark.broker


def test_topology_declares_everything_and_a_second_run_changes_nothing(amqp_url: str) -> None:
    first = cli(amqp_url, "mq", "topology", "--json")
    assert first.returncode == 0, first.stderr
    state = broker_state(amqp_url)
    assert state["exchanges"] == [("eai.claim", "direct", True), ("eai.dlx", "direct", True)]
    dlx_args = (("x-dead-letter-exchange", "eai.dlx"), ("x-dead-letter-routing-key", "claim.dead"))
    # The default retry policy's tiers: a TTL each (ms), dead-lettering back to claim.in
    # through the default exchange, no binding.
    tiers = [
        (
            f"claim.retry.{label}",
            True,
            (
                ("x-dead-letter-exchange", ""),
                ("x-dead-letter-routing-key", "claim.in"),
                ("x-message-ttl", ms),
            ),
        )
        for label, ms in (("5s", 5000), ("30s", 30000), ("2m", 120000), ("10m", 600000))
    ]
    assert state["queues"] == sorted(
        [("claim.dead", True, ()), ("claim.in", True, dlx_args), *tiers]
    )
    assert state["bindings"] == [
        ("eai.claim", "claim.in", "claim"),
        ("eai.dlx", "claim.dead", "claim.dead"),
    ]
    assert set(json.loads(first.stdout)["objects"].values()) == {"created", "bound"}

    second = cli(amqp_url, "mq", "topology", "--json")
    assert second.returncode == 0, second.stderr
    assert second.stderr == ""
    assert broker_state(amqp_url) == state
    objects = json.loads(second.stdout)["objects"]
    assert "created" not in objects.values()


def test_claim_in_dead_letters_to_claim_dead(amqp_url: str) -> None:
    """The DLX arguments really route: a rejected message lands in claim.dead."""
    assert cli(amqp_url, "mq", "topology").returncode == 0
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    ch.basic_publish("eai.claim", "claim", b'{"guid": "x"}')
    method, _, _ = ch.basic_get("claim.in")
    ch.basic_reject(method.delivery_tag, requeue=False)
    conn.close()
    assert queues(amqp_url)["claim.dead"] == (1, 0)
    assert queues(amqp_url)["claim.in"] == (0, 0)


def test_conflicting_queue_exits_4_names_it_and_creates_nothing(amqp_url: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    conn.channel().queue_declare("claim.in", durable=True, arguments={"x-max-length": 10})
    conn.close()

    r = cli(amqp_url, "mq", "topology")
    assert r.returncode == 4, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onceq: "), r.stderr
    assert "claim.in" in lines[0] and "406" in lines[0]
    assert "Traceback" not in r.stderr
    # Refused means no change: the exchanges and claim.dead were not created.
    state = broker_state(amqp_url)
    assert state["exchanges"] == []
    assert [q[0] for q in state["queues"]] == ["claim.in"]


CONFLICTS = {
    # case: (what the broker holds already, the object the refusal names)
    "dlx-fanout": (lambda ch: ch.exchange_declare("eai.dlx", "fanout", durable=True), "eai.dlx"),
    "claim-topic": (
        lambda ch: ch.exchange_declare("eai.claim", "topic", durable=True),
        "eai.claim",
    ),
    "claim-transient": (
        lambda ch: ch.exchange_declare("eai.claim", "direct", durable=False),
        "eai.claim",
    ),
    "in-without-dlx": (lambda ch: ch.queue_declare("claim.in", durable=True), "claim.in"),
    "dead-transient": (lambda ch: ch.queue_declare("claim.dead", durable=False), "claim.dead"),
    "dead-with-ttl": (
        lambda ch: ch.queue_declare("claim.dead", durable=True, arguments={"x-message-ttl": 1000}),
        "claim.dead",
    ),
    # The topology itself, with one object changed: the others exist already.
    "full-but-dead-transient": (
        lambda ch: (
            ch.exchange_declare("eai.claim", "direct", durable=True),
            ch.exchange_declare("eai.dlx", "direct", durable=True),
            ch.queue_declare("claim.dead", durable=False),
        ),
        "claim.dead",
    ),
}


@pytest.mark.parametrize("case", sorted(CONFLICTS))
def test_every_406_exits_4_names_the_object_and_changes_nothing(amqp_url: str, case: str) -> None:
    setup, name = CONFLICTS[case]
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    setup(conn.channel())
    conn.close()
    before = broker_state(amqp_url)
    r = cli(amqp_url, "mq", "topology")
    assert r.returncode == 4, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onceq: "), r.stderr
    assert name in lines[0] and "406" in lines[0], lines
    # Refused means nothing created, nothing bound, nothing changed.
    assert broker_state(amqp_url) == before


@pytest.mark.parametrize(
    "url",
    [
        "amqp://guest:s3cretPassw0rd@127.0.0.1:5672/%2F",  # wrong password
        "amqp://guest:s3cretPassw0rd@127.0.0.1:1/%2F",  # nothing listens there
    ],
)
def test_broker_unavailable_is_one_line_without_the_password(
    url: str, amqp_url: str, tmp_path: Path
) -> None:
    claim = tmp_path / "c.json"
    claim.write_text('{"guid": "g-1", "docs": ["a"]}')
    for args in (
        ("mq", "topology"),
        ("mq", "publish", str(claim)),
        ("mq", "consume", "--claim", "http://127.0.0.1:9", "--max-seconds", "1", "--db",
         str(tmp_path / "db")),
    ):  # fmt: skip
        r = cli(url, *args)
        assert r.returncode == 7, (args, r.stderr)
        assert "s3cretPassw0rd" not in r.stdout + r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "guest:***@127.0.0.1" in r.stderr
        assert r.stdout == ""
    assert not (tmp_path / "db").exists()  # a refused consume leaves no ledger


def test_missing_vhost_is_broker_unavailable(amqp_url: str) -> None:
    r = cli(amqp_url + "-gone", "mq", "topology")
    assert r.returncode == 7
    assert "-gone" in r.stderr and "Traceback" not in r.stderr
    assert vhost(amqp_url) + "-gone" not in ctl("list_vhosts", "name").split()  # not made
    assert broker_state(amqp_url) == {"exchanges": [], "queues": [], "bindings": []}


def test_status_reads_depths_of_the_urls_vhost_and_the_watermark(amqp_url: str) -> None:
    assert cli(amqp_url, "mq", "topology").returncode == 0
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    for i in range(3):
        ch.basic_publish("eai.claim", "claim", b"{}", pika.BasicProperties(message_id=str(i)))
    ch.basic_publish("eai.dlx", "claim.dead", b"{}")
    ch.basic_get("claim.in", auto_ack=False)  # one unacked while status runs
    docs: list[dict] = []

    def unacked_seen() -> bool:  # the management API's statistics are up to 5 s old
        r = cli(amqp_url, "mq", "status", "--json")
        assert r.returncode == 0, r.stderr
        docs.append(json.loads(r.stdout))
        return docs[-1]["queues"]["claim.in"]["unacked"] == 1

    wait_for(unacked_seen, 30, step=0.5)
    conn.close()
    doc = docs[-1]
    assert doc["vhost"] == vhost(amqp_url)
    # `messages` keeps rabbitmqctl's meaning (ready + unacked); `ready` is AMQP's count.
    assert doc["queues"]["claim.in"] == {"messages": 3, "ready": 2, "unacked": 1, "consumers": 0}
    assert doc["queues"]["claim.dead"] == {"messages": 1, "ready": 1, "unacked": 0, "consumers": 0}
    assert doc["queues"]["claim.retry.5s"]["messages"] == 0  # the default policy's tiers
    assert doc["states"]["claim.retry.5s"] == "retry" and doc["states"]["claim.dead"] == "dead"
    broker = json.loads(ctl("status", "--formatter", "json"))
    assert doc["memory"]["limit_bytes"] == broker["vm_memory_high_watermark_limit"]
    assert doc["management"] == {"url": "http://127.0.0.1:15672", "available": True, "error": None}
    human = cli(amqp_url, "mq", "status")
    assert human.returncode == 0 and "claim.dead" in human.stdout and "watermark" in human.stdout


def test_status_needs_no_rabbitmqctl(amqp_url: str, tmp_path: Path) -> None:
    """It reads over the network, as from another host: no rabbitmqctl on PATH."""
    assert cli(amqp_url, "mq", "topology").returncode == 0
    # PATH holds only an empty folder; the CLI itself starts from sys.executable.
    r = cli(amqp_url, "mq", "status", "--json", PATH=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["queues"]["claim.in"]["ready"] == 0
