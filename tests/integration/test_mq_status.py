"""`onceq mq status` through the CLI against the broker's own figures (rabbitmqctl in the
test, never in the command), with and without the management API.

unacked comes from the management API, whose statistics are up to 5 s old: the
command is run again until they match (wait_for), never slept for.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from depth_support import Holder, truth
from mq_support import cli, wait_for
from support import free_port

pytestmark = pytest.mark.broker

CLAIMS = ["claim.in", "claim.retry.5s", "claim.retry.30s", "claim.retry.2m",
          "claim.retry.10m", "claim.dead"]  # fmt: skip
INVOICE = ["invoice.in", "invoice.retry.5s", "invoice.retry.30s", "invoice.retry.2m",
           "invoice.retry.10m", "invoice.dead"]  # fmt: skip


def expected(url: str, names: list[str]) -> dict[str, Any]:
    """The JSON `queues` the broker's own figures call for."""
    now = truth(url)
    return {
        n: None
        if now.get(n) is None
        else {
            "messages": now[n].ready + (now[n].unacked or 0),
            "ready": now[n].ready,
            "unacked": now[n].unacked,
            "consumers": now[n].consumers,
        }
        for n in names
    }


def status_json(url: str, *args: str, **env: str) -> dict[str, Any]:
    r = cli(url, "mq", "status", "--json", *args, **env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def until_true(url: str, names: list[str], *args: str) -> dict[str, Any]:
    """The command's JSON once it matches the broker (the API's statistics catch up)."""
    seen: list[dict[str, Any]] = []

    def same() -> bool:
        seen.append(status_json(url, *args))
        return seen[-1]["queues"] == expected(url, names)

    try:
        wait_for(same, 30, step=0.5)
    except AssertionError:
        raise AssertionError((seen[-1]["queues"], expected(url, names))) from None
    return seen[-1]


def rows(human: str) -> dict[str, list[str]]:
    """{queue: its cells} of the printed table."""
    cells = (re.split(r"\s*│\s*", ln.strip("│ ")) for ln in human.splitlines() if "│" in ln)
    return {c[0]: c[1:] for c in cells}


@pytest.fixture
def claims(amqp_url: str) -> Iterator[str]:
    """The claims topology: 6 in claim.in (2 held unacked by a consumer), 1 in a tier,
    3 in claim.dead."""
    assert cli(amqp_url, "mq", "topology").returncode == 0
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    for i in range(6):
        ch.basic_publish("eai.claim", "claim", b"{}", pika.BasicProperties(message_id=str(i)))
    ch.basic_publish("", "claim.retry.30s", b"{}")
    for _ in range(3):
        ch.basic_publish("eai.dlx", "claim.dead", b"{}")
    holder = Holder(amqp_url, "claim.in", prefetch=2)
    holder.take(2)
    try:
        yield amqp_url
    finally:
        holder.close()
        conn.close()


def test_claims_preset_json_and_table_are_the_brokers_figures(claims: str) -> None:
    doc = until_true(claims, CLAIMS)
    assert doc["queues"]["claim.in"] == {"messages": 6, "ready": 4, "unacked": 2, "consumers": 1}
    assert doc["queues"]["claim.retry.30s"]["ready"] == 1
    assert doc["states"] == {
        "claim.in": "ready",
        **{q: "retry" for q in CLAIMS[1:-1]},
        "claim.dead": "dead",
    }
    assert doc["memory"]["node"] and doc["memory"]["limit_bytes"] > 0
    assert doc["management"]["available"] is True
    human = cli(claims, "mq", "status")
    assert human.returncode == 0, human.stderr
    table = rows(human.stdout)
    assert table["claim.in"] == ["ready", "4", "2", "1"]
    assert table["claim.retry.30s"] == ["retry", "1", "0", "0"]
    assert table["claim.dead"] == ["dead", "3", "0", "0"]
    assert "memory high watermark: limit " in human.stdout and human.stderr == ""


def test_a_flows_own_queues_with_its_retry_delays(amqp_url: str) -> None:
    assert cli(amqp_url, "mq", "topology", "--queue", "invoice.in").returncode == 0
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    for i in range(4):
        ch.basic_publish("invoice", "invoice", b"{}", pika.BasicProperties(message_id=str(i)))
    ch.basic_publish("invoice.dlx", "invoice.dead", b"{}")
    holder = Holder(amqp_url, "invoice.in", prefetch=1)
    holder.take(1)
    try:
        doc = until_true(amqp_url, INVOICE, "--queue", "invoice.in")
        assert doc["queues"]["invoice.in"] == {
            "messages": 4, "ready": 3, "unacked": 1, "consumers": 1,
        }  # fmt: skip
        # Other delays: the tiers those would be, absent here (mq topology declared the
        # default ones).
        other = status_json(amqp_url, "--queue", "invoice.in", "--retry-delays", "1m")
        assert list(other["queues"]) == ["invoice.dead", "invoice.in", "invoice.retry.1m"]
        assert other["queues"]["invoice.retry.1m"] is None
        table = rows(cli(amqp_url, "mq", "status", "--queue", "invoice.in").stdout)
        assert table["invoice.in"] == ["ready", "3", "1", "1"] and "claim.in" not in table
    finally:
        holder.close()
        conn.close()


@pytest.mark.parametrize("how", ["off", "env off", "closed port"])
def test_without_the_management_api_ready_and_consumers_still_hold(claims: str, how: str) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    args, env = {
        "off": (["--management-url", "off"], {}),
        "env off": ([], {"EAI_RABBITMQ_API": "off"}),
        "closed port": (["--management-url", closed], {}),
    }[how]
    r = cli(claims, "mq", "status", "--json", *args, **env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["queues"]["claim.in"] == {
        "messages": None, "ready": 4, "unacked": None, "consumers": 1,
    }  # fmt: skip
    assert doc["queues"]["claim.dead"]["ready"] == 3
    assert doc["management"]["available"] is False and doc["management"]["error"]
    assert doc["memory"]["limit_bytes"] is None and doc["memory"]["unknown"]
    if how == "closed port":
        assert doc["management"]["url"] == closed and "cannot connect" in r.stderr
    human = cli(claims, "mq", "status", *args, **env)
    assert human.returncode == 0, human.stderr
    assert rows(human.stdout)["claim.in"] == ["ready", "4", "-", "1"]
    lines = human.stdout.splitlines()
    assert "memory high watermark: unknown (needs the management API)" in lines
    assert any(ln.startswith("management API") and "need it" in ln for ln in lines)


def test_a_wrong_api_password_never_shows(claims: str) -> None:
    override = "http://guest:apiSECRET42@127.0.0.1:15672"
    for args in (["--json"], []):
        r = cli(claims, "mq", "status", "--management-url", override, *args)
        assert r.returncode == 0, r.stderr
        assert "apiSECRET42" not in r.stdout + r.stderr
        assert "login refused (401)" in r.stdout + r.stderr
    doc = json.loads(cli(claims, "mq", "status", "--json", EAI_RABBITMQ_API=override).stdout)
    assert doc["management"]["url"] == "http://guest:***@127.0.0.1:15672"
    assert doc["queues"]["claim.in"]["unacked"] is None


def test_a_missing_vhost_is_exit_7_in_one_line(amqp_url: str) -> None:
    r = cli(amqp_url + "-gone", "mq", "status")
    assert r.returncode == 7, r.stderr
    assert "does not exist" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert r.stdout == ""


def test_node_picks_the_memory_shown_and_an_unknown_one_is_exit_3(claims: str) -> None:
    node = status_json(claims)["memory"]["node"]
    assert status_json(claims, "--node", node)["memory"]["node"] == node
    r = cli(claims, "mq", "status", "--node", "rabbit@nowhere")
    assert r.returncode == 3 and node in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("bad", ["ftp://h", "http://h:0", "amqp://u:mgSECRET77@h"])
def test_a_bad_management_url_is_exit_2_masked(amqp_url: str, bad: str) -> None:
    for args, env in ((["--management-url", bad], {}), ([], {"EAI_RABBITMQ_API": bad})):
        r = cli(amqp_url, "mq", "status", *args, **env)
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "mgSECRET77" not in r.stderr
        assert ("--management-url" if args else "EAI_RABBITMQ_API=") in r.stderr
