"""A flow's retry tiers on RabbitMQ (names, arguments, refusals) and a copy's headers."""

from __future__ import annotations

import pytest

from onceq._core.retry import DEFAULT_DELAYS, RetryPolicy
from onceq._exercise.claims import claims_flow
from onceq._flows.flow import Flow
from onceq._sources.amqp.plugin import RabbitSource
from onceq._sources.amqp.retry import copy_headers
from onceq._sources.amqp.topology import Queue, Topology
from onceq._sources.amqp.topology_declare import plan
from onceq.errors import UsageError


def test_no_delays_is_exactly_the_exercise_topology() -> None:
    # Every existing caller (no retry_delays) keeps the six objects of seed 001.
    assert Topology.claims().objects() == Topology.claims(()).objects()
    objects, _ = Topology.claims().objects()
    assert [o.name for o in objects] == ["eai.claim", "eai.dlx", "claim.in", "claim.dead"]
    assert Topology.claims().retry_queues == ()


def test_one_queue_per_delay_named_by_the_stem_with_a_queue_ttl_back_to_the_work_queue() -> None:
    t = Topology.claims(DEFAULT_DELAYS)
    assert t.retry_queues == (
        "claim.retry.5s",
        "claim.retry.30s",
        "claim.retry.2m",
        "claim.retry.10m",
    )
    objects, bindings = t.objects()
    tiers = [o for o in objects if isinstance(o, Queue) and ".retry." in o.name]
    assert tiers == [
        Queue(
            f"claim.retry.{label}",
            arguments={
                "x-message-ttl": ms,  # an int of milliseconds: the broker refuses a float
                "x-dead-letter-exchange": "",  # the default exchange: straight to …
                "x-dead-letter-routing-key": "claim.in",  # … the work queue, no binding
            },
        )
        for label, ms in (("5s", 5000), ("30s", 30000), ("2m", 120000), ("10m", 600000))
    ]
    assert all(isinstance(q.arguments["x-message-ttl"], int) for q in tiers)
    # No binding for a tier: nothing is published to it by routing, and its expired
    # copies go to the work queue alone (no other queue bound to eai.claim gets one).
    assert not any(".retry." in b.queue for b in bindings)


@pytest.mark.parametrize(
    ("queue", "delays", "names"),
    [
        ("invoice.in", (1.0, 2.5), ("invoice.retry.1s", "invoice.retry.2500ms")),
        ("billing", (90.0,), ("billing.retry.90s",)),
        ("a.b.in", (3600.0, 86400.0), ("a.b.retry.1h", "a.b.retry.1d")),
    ],
)
def test_for_queue_names_the_tiers_from_the_same_stem(
    queue: str, delays: tuple[float, ...], names: tuple[str, ...]
) -> None:
    t = Topology.for_queue(queue, retry_delays=delays)
    assert t.retry_queues == names and t.problems() == []
    assert Topology.from_options(queue, retry_delays=delays) == t
    assert [t.retry_queue(d) for d in delays] == list(names)


def test_a_flow_gives_its_policys_tiers() -> None:
    flow = claims_flow("http://127.0.0.1:1")
    assert Topology.for_flow(flow).retry_queues == tuple(
        f"claim.retry.{x}" for x in ("5s", "30s", "2m", "10m")
    )
    flow.retry = RetryPolicy.exercise()
    assert Topology.for_flow(flow) == Topology.claims()
    own = Flow("inv", RabbitSource("invoice.in"), retry=RetryPolicy(immediate=0, delays=(1, 10)))
    assert Topology.for_flow(own).retry_queues == ("invoice.retry.1s", "invoice.retry.10s")


def test_a_tier_name_too_long_names_the_queue_it_derives_from() -> None:
    t = Topology.for_queue("q" * 250, dead_letter_exchange="d", dead_letter_queue="dq")
    assert t.problems() == []  # without tiers the names fit
    long = Topology.for_queue(
        "q" * 250, dead_letter_exchange="d", dead_letter_queue="dq", retry_delays=(5.0,)
    )
    [problem] = long.problems()
    assert problem.startswith("--queue: ") and "5s retry queue" in problem
    assert "259 bytes" in problem  # 250 + len(".retry.5s")
    with pytest.raises(UsageError):
        long.check()
    # A flow file names the key.
    [keyed] = long.problems(lambda f: f"flows.inv.{f}")
    assert keyed.startswith("flows.inv.queue: ")


def test_a_dead_letter_queue_that_is_also_a_tier_is_refused_before_connecting() -> None:
    t = Topology.for_queue("inv.in", dead_letter_queue="inv.retry.5s", retry_delays=(5.0,))
    [problem] = t.problems()
    assert problem.startswith("--dead-letter-queue: 'inv.retry.5s': ")
    assert "retry queue" in problem and "\n" not in problem


def test_plan_refuses_a_tier_that_is_another_flows_queue() -> None:
    a = Topology.for_queue("a.in", retry_delays=(5.0,))
    b = Topology.for_queue("a.retry.5s")  # b's input queue is a's tier
    with pytest.raises(UsageError, match=r"queue a\.retry\.5s"):
        plan((a, b))
    # Two flows with the same tiers on one queue merge into one set of objects.
    objects, _ = plan((a, Topology.for_queue("a.in", retry_delays=(5.0,))))
    assert [o.name for o in objects].count("a.retry.5s") == 1


def test_a_copy_keeps_every_header_but_the_brokers_dead_letter_history() -> None:
    headers = {
        "x-onceq-copy": "abc",
        "tenant": "t1",
        "x-death": [{"queue": "claim.retry.5s", "reason": "expired", "count": 1}],
        "x-first-death-queue": "claim.retry.5s",
        "x-first-death-reason": "expired",
        "x-first-death-exchange": "",
        "x-last-death-queue": "claim.retry.5s",
        "x-last-death-reason": "expired",
        "x-last-death-exchange": "",
        "x-deathly": "kept: only the broker's own names go",
    }
    assert copy_headers(headers) == {
        "x-onceq-copy": "abc",
        "tenant": "t1",
        "x-deathly": "kept: only the broker's own names go",
    }
    assert copy_headers(None) == {}
