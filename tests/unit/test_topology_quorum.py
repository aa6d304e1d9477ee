"""Queue types and the start-up checks' parsing, without a broker (the broker's own
answers are quoted from RabbitMQ 3.10.8; tests/integration/test_mq_quorum.py runs them)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from onceq._sources.amqp.plugin import RabbitSource
from onceq._sources.amqp.preflight import (
    QueueFacts,
    broker_consumer_timeout,
    consumer_timeout_problem,
    dead_letter_problem,
    delivery_limit_problem,
    fix_command,
    parse_ctl,
    parse_inequivalent,
)
from onceq._sources.amqp.retry import copy_headers
from onceq._sources.amqp.topology import Queue, Topology
from onceq._sources.amqp.topology_declare import plan
from onceq._sources.amqp.topology_types import DELIVERY_LIMIT
from onceq.errors import UsageError


def _queues(t: Topology) -> dict[str, dict]:
    return {o.name: o.arguments for o in t.objects()[0] if isinstance(o, Queue)}


def test_classic_is_the_default_and_declares_no_quorum_argument() -> None:
    t = Topology.claims((5.0,))
    assert t.queue_type == "classic"
    assert _queues(t) == {
        "claim.in": {
            "x-dead-letter-exchange": "eai.dlx",
            "x-dead-letter-routing-key": "claim.dead",
        },
        "claim.dead": {},
        "claim.retry.5s": {
            "x-message-ttl": 5000,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "claim.in",
        },
    }


def test_quorum_makes_every_queue_quorum_with_limits_where_consumed() -> None:
    qs = _queues(Topology.for_queue("inv.in", retry_delays=(2.0,), queue_type="quorum"))
    assert qs == {
        "inv.in": {
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": "inv.dlx",
            "x-dead-letter-routing-key": "inv.dead",
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
            "x-delivery-limit": DELIVERY_LIMIT,
        },
        # Browsed by `mq dead` (every browse is a return): the limit, no dead-lettering.
        "inv.dead": {"x-queue-type": "quorum", "x-delivery-limit": DELIVERY_LIMIT},
        # Never consumed: no limit; its expiry into the work queue at least once.
        "inv.retry.2s": {
            "x-queue-type": "quorum",
            "x-message-ttl": 2000,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "inv.in",
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        },
    }
    # -1 would mean "unlimited" only from 4.0 (3.x: dead at the first return).
    assert DELIVERY_LIMIT > 0


def test_a_flows_source_gives_its_type_and_a_missing_one_is_classic() -> None:
    assert Topology.for_source(RabbitSource("a.in", queue_type="quorum")).queue_type == "quorum"
    assert Topology.for_source(RabbitSource("a.in")).queue_type == "classic"
    assert Topology.from_options(queue_type="quorum") == Topology.claims(queue_type="quorum")


def test_an_unknown_type_is_named_by_its_option_or_key() -> None:
    t = Topology.claims(queue_type="Quorum")
    assert t.problems() == ["--queue-type: 'Quorum': must be 'classic' or 'quorum'"]
    assert t.problems(lambda f: f"flows.x.{f}")[0].startswith("flows.x.queue_type: ")
    with pytest.raises(UsageError):
        t.check()


def test_two_flows_wanting_one_queue_of_two_types_are_refused_before_connecting() -> None:
    with pytest.raises(UsageError, match=r"queue inv\.in: wanted with two different"):
        plan((Topology.for_queue("inv.in"), Topology.for_queue("inv.in", queue_type="quorum")))


# The broker's 406 texts, as aiormq words them (RabbitMQ 3.10.8).
NONE_TEXT = (
    "The client requested a method that was not allowed because some precondition failed: "
    "\"PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue 'q' in"
    " vhost '/': received the value 'eai.dlx' of type 'longstr' but current is none\""
)
VALUE_TEXT = (
    "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'h4.q' in vhost '/':"
    " received none but current is the value 'quorum' of type 'longstr'"
)
INT_TEXT = (
    "PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'q' in vhost 'v':"
    " received the value '5' of type 'byte' but current is the value '1000000' of type"
    " 'signedint'"
)
DURABLE_TEXT = (
    "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in vhost '/':"
    " received 'true' but current is 'false'"
)


def test_a_406_names_one_argument_and_its_current_value() -> None:
    assert parse_inequivalent(NONE_TEXT) == ("x-dead-letter-exchange", (False, None))
    assert parse_inequivalent(VALUE_TEXT) == ("x-queue-type", (True, "quorum"))
    assert parse_inequivalent(INT_TEXT) == ("x-delivery-limit", (True, 1_000_000))
    assert parse_inequivalent(DURABLE_TEXT) == ("durable", (True, False))
    same_type = (
        "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue 'claim.in'"
        " in vhost 'v': received 'eai.dlx' but current is 'other.dlx'"
    )
    assert parse_inequivalent(same_type) == ("x-dead-letter-exchange", (True, "other.dlx"))
    limit = same_type.replace("x-dead-letter-exchange", "x-delivery-limit")
    limit = limit.replace("'eai.dlx'", "'5'").replace("'other.dlx'", "'20'")
    assert parse_inequivalent(limit, {"x-delivery-limit": 5}) == ("x-delivery-limit", (True, 20))
    assert parse_inequivalent("PRECONDITION_FAILED - something else") is None
    table = VALUE_TEXT.replace("'quorum' of type 'longstr'", "'[]' of type 'table'")
    assert parse_inequivalent(table) is None


def test_dead_letter_problem_says_what_is_missing_or_different() -> None:
    t = Topology.claims()
    good = {"x-dead-letter-exchange": "eai.dlx", "x-dead-letter-routing-key": "claim.dead"}
    assert dead_letter_problem(t, good) == ""
    assert dead_letter_problem(t, {}) == "has no x-dead-letter-exchange (onceq expects 'eai.dlx')"
    assert dead_letter_problem(t, {**good, "x-dead-letter-routing-key": "x"}) == (
        "has x-dead-letter-routing-key 'x', onceq expects 'claim.dead'"
    )


def test_the_fix_command_declares_the_flows_own_topology() -> None:
    assert fix_command(Topology.claims((5.0, 30.0, 120.0, 600.0))) == "onceq mq topology"
    assert fix_command(Topology.claims()) == "onceq mq topology --retry-delays none"
    t = Topology.for_queue(
        "inv.in", dead_letter_queue="graveyard", retry_delays=(1.0,), queue_type="quorum"
    )
    assert fix_command(t) == (
        "onceq mq topology --queue inv.in --dead-letter-queue graveyard --retry-delays 1s"
        " --queue-type quorum"
    )
    default = (5.0, 30.0, 120.0, 600.0)
    own_dlx = Topology.from_options(dead_letter_exchange="dlx2", retry_delays=default)
    assert fix_command(own_dlx) == "onceq mq topology --dead-letter-exchange dlx2"


@pytest.mark.parametrize(
    ("version", "args", "warned"),
    [
        ("4.0.5", {"x-queue-type": "quorum"}, "after 20 returns"),
        ("3.13.7", {"x-queue-type": "quorum"}, ""),  # no default limit before 4.0
        ("3.10.8", {"x-queue-type": "quorum", "x-delivery-limit": -1}, "first return"),
        ("4.3.0", {"x-queue-type": "quorum", "x-delivery-limit": -1}, ""),  # unlimited
        ("4.1.0", {"x-queue-type": "quorum", "x-delivery-limit": DELIVERY_LIMIT}, ""),
        ("4.1.0", {}, ""),  # classic: no broker-side limit at all
    ],
)
def test_delivery_limit_warning_per_broker_version(version: str, args: dict, warned: str) -> None:
    problem = delivery_limit_problem(QueueFacts(arguments=args, broker_version=version))
    assert (warned in problem and problem != "") if warned else problem == ""


def test_rabbitmqctl_answers_are_read_or_declared_unreadable() -> None:
    assert parse_ctl("{ok,1800000}\n") == (True, 1_800_000)
    assert parse_ctl("undefined") == (True, None)  # no timeout configured
    assert parse_ctl("Error: unable to perform an operation on node") == (False, None)


def test_consumer_timeout_warns_only_below_call_plus_margin() -> None:
    assert consumer_timeout_problem(1_800_000, 10.0, "the broker's consumer_timeout") == ""
    assert consumer_timeout_problem(None, 1e6, "x") == ""
    warned = consumer_timeout_problem(30_000, 10.0, "the broker's consumer_timeout")
    assert warned.startswith("the broker's consumer_timeout is 30s, shorter than")
    assert "10s call timeout + 60s" in warned and "\n" not in warned


def test_a_broker_elsewhere_is_not_asked_and_says_so_once_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="onceq.amqp.preflight")
    url = "amqp://guest:s3cret@10.255.255.1:5672/v"
    assert asyncio.run(broker_consumer_timeout(url)) == (False, None)
    [record] = caplog.records
    assert record.levelno == logging.DEBUG and "s3cret" not in record.getMessage()


def test_a_copy_drops_the_quorum_queues_own_counters() -> None:
    headers = {"x-delivery-count": 3, "x-acquired-count": 4, "x-onceq-copy": "c1", "a": 1}
    assert copy_headers(headers) == {"x-onceq-copy": "c1", "a": 1}


def test_a_queue_named_as_its_own_stem_is_checked_as_a_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--queue orders` (no ".in"): the exchange is called "orders" too and comes first
    in the topology's objects; the start-up check must read the queue's arguments, not
    fail on the exchange (found by mypy: an Exchange has no arguments)."""
    from onceq._sources.amqp import preflight

    t = Topology.for_queue("orders")
    seen: list[dict] = []

    async def read_arguments(url: str, queue: str, guess: dict) -> QueueFacts:
        seen.append(guess)
        return QueueFacts(arguments=dict(guess))

    monkeypatch.setattr(preflight, "read_arguments", read_arguments)
    facts = asyncio.run(preflight.check_work_queue("amqp://127.0.0.1:1/", t))
    assert seen == [_queues(t)["orders"]]
    assert facts is not None and facts.arguments["x-dead-letter-exchange"] == "orders.dlx"
