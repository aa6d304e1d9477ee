"""`onceq mq topology --flows FILE`: every rabbitmq flow of a flow file declared, as
`onceq run FILE` will consume it. Real broker, one vhost per test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mq_support import broker_state, cli

pytestmark = pytest.mark.broker

FLOWS = """\
ledger = "ledger.db"

[flows.invoices]
source = "rabbitmq"
queue = "invoice.in"
id_field = "invoiceId"
retry = { delays = ["1s", "1m"] }

[flows.payments]
source = "rabbitmq"
queue = "pay"
exchange = "money"
dead_letter_queue = "pay.graveyard"
retry = "exercise"

[flows.files]
source = "dirq"
path = "q"
"""
EXPECTED = {
    "exchanges": [
        ("invoice", "direct", True),
        ("invoice.dlx", "direct", True),
        ("money", "direct", True),
        ("pay.dlx", "direct", True),
    ],
    "queues": [
        ("invoice.dead", True, ()),
        ("invoice.in", True, (("x-dead-letter-exchange", "invoice.dlx"),
                              ("x-dead-letter-routing-key", "invoice.dead"))),
        # Each flow's own retry policy: invoices' two tiers, none for payments.
        ("invoice.retry.1m", True, (("x-dead-letter-exchange", ""),
                                    ("x-dead-letter-routing-key", "invoice.in"),
                                    ("x-message-ttl", 60000))),
        ("invoice.retry.1s", True, (("x-dead-letter-exchange", ""),
                                    ("x-dead-letter-routing-key", "invoice.in"),
                                    ("x-message-ttl", 1000))),
        ("pay", True, (("x-dead-letter-exchange", "pay.dlx"),
                       ("x-dead-letter-routing-key", "pay.graveyard"))),
        ("pay.graveyard", True, ()),
    ],
    "bindings": [
        ("invoice", "invoice.in", "invoice"),
        ("invoice.dlx", "invoice.dead", "invoice.dead"),
        ("money", "pay", "pay"),
        ("pay.dlx", "pay.graveyard", "pay.graveyard"),
    ],
}  # fmt: skip


def test_every_rabbitmq_flow_is_declared_and_a_second_run_changes_nothing(
    amqp_url: str, tmp_path: Path
) -> None:
    (tmp_path / "flows.toml").write_text(FLOWS)
    first = cli(amqp_url, "mq", "topology", "--flows", str(tmp_path / "flows.toml"), "--json")
    assert first.returncode == 0, first.stderr
    assert broker_state(amqp_url) == EXPECTED
    assert set(json.loads(first.stdout)["objects"].values()) == {"created", "bound"}
    assert not (tmp_path / "q").exists() and not (tmp_path / "ledger.db").exists()

    second = cli(amqp_url, "mq", "topology", "--flows", str(tmp_path / "flows.toml"))
    assert second.returncode == 0, second.stderr
    assert second.stdout.startswith("topology ready in vhost") and "0 created" in second.stdout
    assert broker_state(amqp_url) == EXPECTED


def test_a_flow_files_unusable_name_is_named_by_its_key_and_nothing_is_created(
    amqp_url: str, tmp_path: Path
) -> None:
    bad = FLOWS.replace('exchange = "money"', 'exchange = "amq.money"')
    (tmp_path / "flows.toml").write_text(bad)
    r = cli(amqp_url, "mq", "topology", "--flows", str(tmp_path / "flows.toml"))
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(
        f"onceq: {tmp_path / 'flows.toml'}: line 12: flows.payments.exchange: 'amq.money': "
    ), r.stderr
    assert broker_state(amqp_url) == {"exchanges": [], "queues": [], "bindings": []}
    # `onceq check` finds it too: a name the broker would refuse is the file's mistake.
    c = cli(amqp_url, "check", str(tmp_path / "flows.toml"))
    assert c.returncode == 2 and "flows.payments.exchange: 'amq.money'" in c.stderr, c.stderr


def test_flows_with_names_or_without_a_rabbitmq_flow_is_a_usage_error(
    amqp_url: str, tmp_path: Path
) -> None:
    (tmp_path / "flows.toml").write_text(FLOWS)
    r = cli(amqp_url, "mq", "topology", "--flows", str(tmp_path / "flows.toml"), "--queue", "x")
    assert r.returncode == 2 and r.stderr.startswith("onceq: --flows: "), r.stderr
    only_dirq = FLOWS[: FLOWS.index("[flows.invoices]")] + FLOWS[FLOWS.index("[flows.files]") :]
    (tmp_path / "dirq.toml").write_text(only_dirq)
    r = cli(amqp_url, "mq", "topology", "--flows", str(tmp_path / "dirq.toml"))
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"onceq: {tmp_path / 'dirq.toml'}: no rabbitmq flow: nothing to declare\n"
    r = cli(amqp_url, "mq", "topology", "--flows", str(tmp_path / "absent.toml"))
    assert r.returncode == 2 and "no such flow file" in r.stderr, r.stderr
    assert broker_state(amqp_url) == {"exchanges": [], "queues": [], "bindings": []}
