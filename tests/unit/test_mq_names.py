"""A flow's RabbitMQ names (Topology) and the publisher's id field, without a broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onceq._sources.amqp.publisher import check_target, load_message, load_messages
from onceq._sources.amqp.topology import (
    BINDINGS,
    EXCHANGES,
    QUEUES,
    Binding,
    Exchange,
    Queue,
    Topology,
)
from onceq._sources.amqp.topology_declare import plan
from onceq.errors import BadMessage, UsageError


def test_claims_preset_is_the_exercise_names() -> None:
    t = Topology.claims()
    assert t == Topology("claim.in", "eai.claim", "claim", "eai.dlx", "claim.dead")
    objects, bindings = t.objects()
    assert objects == [
        Exchange("eai.claim"),
        Exchange("eai.dlx"),
        Queue(
            "claim.in",
            arguments={
                "x-dead-letter-exchange": "eai.dlx",
                "x-dead-letter-routing-key": "claim.dead",
            },
        ),
        Queue("claim.dead"),
    ]
    assert bindings == [
        Binding("eai.claim", "claim.in", "claim"),
        Binding("eai.dlx", "claim.dead", "claim.dead"),
    ]
    # The module constants other code imports stay the preset's.
    assert [*EXCHANGES, *QUEUES] == objects and list(BINDINGS) == bindings
    # No options on the CLI: exactly the preset.
    assert Topology.from_options() == t


@pytest.mark.parametrize(
    ("queue", "expected"),
    [
        ("invoice.in", ("invoice", "invoice", "invoice.dlx", "invoice.dead")),
        ("billing", ("billing", "billing", "billing.dlx", "billing.dead")),
        ("a.b.in", ("a.b", "a.b", "a.b.dlx", "a.b.dead")),
        ("inbox", ("inbox", "inbox", "inbox.dlx", "inbox.dead")),  # no ".in" suffix
        (".in", (".in", ".in", ".in.dlx", ".in.dead")),  # the suffix alone is no stem
    ],
)
def test_for_queue_derives_the_rest_from_the_stem(queue: str, expected: tuple[str, ...]) -> None:
    t = Topology.for_queue(queue)
    assert (t.exchange, t.routing_key, t.dead_letter_exchange, t.dead_letter_queue) == expected
    assert t.queue == queue and t.dead_key == expected[3]
    assert t.problems() == []


def test_each_option_overrides_its_one_name() -> None:
    t = Topology.from_options("invoice.in", routing_key="inv", dead_letter_queue="inv.parked")
    assert t == Topology("invoice.in", "invoice", "inv", "invoice.dlx", "inv.parked")
    # Without --queue the others override the claims names.
    t = Topology.from_options(exchange="eai.claim2")
    assert t == Topology("claim.in", "eai.claim2", "claim", "eai.dlx", "claim.dead")


@pytest.mark.parametrize(
    ("kwargs", "label", "why"),
    [
        ({"queue": "amq.mine"}, "--queue", "reserved"),
        ({"queue": "invoice.in", "exchange": "amq.direct"}, "--exchange", "reserved"),
        ({"queue": "q", "dead_letter_exchange": ""}, "--dead-letter-exchange", "empty"),
        ({"queue": "x" * 256}, "--queue", "256 bytes"),
        ({"queue": "é" * 128}, "--queue", "256 bytes"),  # bytes, not characters
        ({"queue": "q\nq"}, "--queue", "control character"),
        ({"queue": "q\ud800"}, "--queue", "lone surrogate"),
        ({"queue": "q", "dead_letter_queue": "q"}, "--dead-letter-queue", "the queue itself"),
        (
            {"queue": "q", "exchange": "x", "dead_letter_exchange": "x", "routing_key": "q.dead"},
            "--routing-key",
            "dead-letter key",
        ),
    ],
)
def test_a_name_that_cannot_be_used_is_one_line_naming_the_option(
    kwargs: dict[str, str], label: str, why: str
) -> None:
    t = Topology.from_options(**kwargs)
    with pytest.raises(UsageError) as err:
        t.check()
    text = str(err.value)
    assert text.startswith(f"{label}: ") and why in text and "\n" not in text
    # A flow file names the key instead of the option.
    found = t.problems(lambda f: f"flows.invoices.{f}")
    assert found and found[0].startswith(f"flows.invoices.{label[2:].replace('-', '_')}: ")


def test_the_longest_name_and_an_empty_routing_key_are_fine() -> None:
    longest = "x" * 255
    t = Topology(longest, longest, "", "y" * 255, "z" * 255)
    assert t.problems() == []
    # A derived name that grows past the limit names the option that would set it.
    [problem] = Topology.for_queue("x" * 252, dead_letter_queue="d").problems()
    assert problem.startswith("--dead-letter-exchange: ") and "256 bytes" in problem


def test_plan_merges_shared_objects_and_refuses_one_name_two_ways() -> None:
    a = Topology.for_queue("a.in", dead_letter_exchange="shared.dlx")
    b = Topology.for_queue("b.in", dead_letter_exchange="shared.dlx")
    objects, bindings = plan((a, b))
    names = [o.name for o in objects]
    assert names.count("shared.dlx") == 1 and len(names) == 7 and len(bindings) == 4
    # b's input queue is a's dead-letter queue: the broker would refuse the second half.
    clash = Topology.for_queue("a.dead")
    with pytest.raises(UsageError, match=r"queue a\.dead"):
        plan((a, clash))


def _write(tmp_path: Path, name: str, doc: object) -> Path:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


def test_id_field_takes_message_id_from_that_field_or_a_dotted_path(tmp_path: Path) -> None:
    p = _write(tmp_path, "i.json", {"invoiceId": "INV-1", "meta": {"id": 42}, "total": 1})
    m = load_message(p, "invoiceId")
    assert m.msg_id == "INV-1" and m.body == p.read_bytes()
    assert load_message(p, "meta.id").msg_id == "42"  # an integer id becomes its text
    assert load_message(_write(tmp_path, "c.json", {"guid": "g"})).msg_id == "g"  # the default


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        ({"customer": "ACME"}, "no invoiceId (a non-empty string is needed for message_id)"),
        ({"invoiceId": ""}, "no invoiceId"),
        ({"invoiceId": "  "}, "no invoiceId"),
        ({"invoiceId": None}, "no invoiceId"),
        ({"invoiceId": True}, "no invoiceId"),
        ({"invoiceId": ["x"]}, "no invoiceId"),
        ({"invoiceId": "x" * 256}, "invoiceId is 256 bytes"),
        ({"invoiceId": "a\tb"}, "invoiceId holds a control character"),
        ('{"invoiceId": "\\ud800"}', "invoiceId holds a lone surrogate"),
        ('{"invoiceId": "I", "n": ' + "9" * 5000 + "}", "not JSON"),
    ],
)
def test_every_id_check_applies_to_the_chosen_field(tmp_path: Path, doc: object, why: str) -> None:
    bad = _write(tmp_path, "bad.json", doc)
    good = _write(tmp_path, "good.json", {"invoiceId": "INV-1"})
    with pytest.raises(BadMessage) as err:
        load_messages([good, bad], "invoiceId")
    text = str(err.value)
    assert str(bad) in text and why in text and text.endswith("nothing was published")


def test_a_dotted_path_through_a_non_object_is_missing(tmp_path: Path) -> None:
    p = _write(tmp_path, "i.json", {"meta": "flat"})
    with pytest.raises(BadMessage, match=r"no meta\.id"):
        load_message(p, "meta.id")


@pytest.mark.parametrize(
    ("exchange", "key", "label"),
    [
        ("x" * 256, "k", "--exchange"),
        ("e", "k\x00", "--routing-key"),
        ("e", "\udcff", "--routing-key"),
    ],
)
def test_publish_target_names_are_checked(exchange: str, key: str, label: str) -> None:
    with pytest.raises(UsageError, match=f"^{label}: "):
        check_target(exchange, key)


def test_publish_may_target_the_default_and_amq_exchanges() -> None:
    check_target("", "invoice.in")
    check_target("amq.direct", "invoice")
