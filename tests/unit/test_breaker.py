"""The breaker's state machine (onceq._core.breaker) on an injected clock: every transition."""

from __future__ import annotations

import logging

import pytest

from onceq._core.breaker import Breaker
from onceq._core.consumer import Outcome
from onceq._core.retry import BreakerPolicy
from onceq._core.transport import Kind

FAIL = Outcome(Kind.TRANSIENT, "connect-error")
OK = Outcome(Kind.SUCCESS)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(
    failures: int = 3, probe: float = 1.0, max_probe: float = 8.0
) -> tuple[Breaker, Clock, list[tuple[str, str]]]:
    clock = Clock()
    changes: list[tuple[str, str]] = []
    b = Breaker(
        BreakerPolicy(failures=failures, probe=probe, max_probe=max_probe),
        name="claims",
        clock=clock,
        on_change=lambda old, new: changes.append((old, new)),
    )
    return b, clock, changes


def fail_distinct(b: Breaker, n: int, start: int = 0, outcome: Outcome = FAIL) -> None:
    for i in range(start, start + n):
        assert b.allow(f"m{i}")
        b.record(f"m{i}", outcome)


def test_closed_allows_and_opens_after_k_failures_on_distinct_messages() -> None:
    b, _, changes = make(failures=3)
    assert b.state == "closed" and b.probe_in() is None
    fail_distinct(b, 2)
    assert b.state == "closed"
    fail_distinct(b, 1, start=2)
    assert b.state == "open" and changes == [("closed", "open")] and b.opened == 1
    assert not b.allow("m9")


def test_the_same_message_failing_again_does_not_count() -> None:
    b, _, _ = make(failures=3)
    for _ in range(10):  # one poisoned message, its immediate retries, its tiers
        b.record("m0", FAIL)
    b.record("m1", FAIL)
    b.record("m1", FAIL)
    assert b.state == "closed"
    b.record("m2", FAIL)
    assert b.state == "open"


@pytest.mark.parametrize(
    "answer", [OK, Outcome(Kind.REJECTED, "http-422"), Outcome(Kind.SUCCESS, fields={"x": 1})]
)
def test_any_answer_that_is_not_transient_ends_the_streak(answer: Outcome) -> None:
    b, _, _ = make(failures=3)
    fail_distinct(b, 2)
    b.record("m5", answer)
    fail_distinct(b, 2, start=10)
    assert b.state == "closed"
    fail_distinct(b, 1, start=20)
    assert b.state == "open"


def test_probe_waits_then_one_probe_at_a_time_and_a_success_closes() -> None:
    b, clock, changes = make(failures=2, probe=1.0)
    fail_distinct(b, 2)
    assert b.probe_in() == pytest.approx(1.0)
    clock.now += 0.999
    assert not b.allow("a") and b.state == "open"
    clock.now += 0.001
    assert b.allow("probe") and b.state == "half-open"
    assert b.probe_in() is None
    assert not b.allow("b") and not b.allow("c")  # one probe at a time
    b.record("probe", OK)
    assert b.state == "closed" and b.allow("d")
    assert changes == [("closed", "open"), ("open", "half-open"), ("half-open", "closed")]


def test_a_rejected_probe_closes_too_the_partner_answered() -> None:
    b, clock, _ = make(failures=1)
    fail_distinct(b, 1)
    clock.now += 1
    assert b.allow("p")
    b.record("p", Outcome(Kind.REJECTED, "http-422"))
    assert b.state == "closed"


def test_failed_probes_double_the_delay_up_to_the_cap_and_a_close_resets_it() -> None:
    b, clock, _ = make(failures=1, probe=1.0, max_probe=5.0)
    fail_distinct(b, 1)
    waits = []
    for i in range(6):
        waits.append(b.probe_in())
        clock.now += b.probe_in() or 0.0
        assert b.allow(f"p{i}")
        b.record(f"p{i}", FAIL)
        assert b.state == "open"
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    clock.now += 5.0
    assert b.allow("p")
    b.record("p", OK)
    fail_distinct(b, 1, start=50)
    assert b.probe_in() == 1.0  # a fresh opening starts again at `probe`
    assert b.opened == 2


def test_retry_after_pushes_the_probe_back_even_past_the_cap() -> None:
    b, clock, _ = make(failures=2, probe=1.0, max_probe=8.0)
    fail_distinct(b, 1)
    b.record("m1", Outcome(Kind.TRANSIENT, "http-503", retry_after=30))
    assert b.probe_in() == 30.0
    clock.now += 29
    assert not b.allow("x")
    clock.now += 1
    assert b.allow("p")
    b.record("p", Outcome(Kind.TRANSIENT, "http-503", retry_after=3))
    assert b.probe_in() == 3.0  # max(2s the doubling asks, 3s the partner asks)


def test_a_stale_outcome_while_open_changes_no_state_but_its_retry_after_counts() -> None:
    b, clock, changes = make(failures=2, probe=1.0)
    fail_distinct(b, 2)
    b.record("late-ok", OK)  # started before it opened: says nothing about now
    b.record("late-fail", FAIL)
    assert b.state == "open" and b.probe_in() == 1.0
    b.record("late-busy", Outcome(Kind.TRANSIENT, "http-503", retry_after=10))
    assert b.probe_in() == 10.0
    clock.now += 10
    assert b.allow("p")
    b.record("late-2", OK)  # not the probe: half-open waits for the probe's own answer
    assert b.state == "half-open"
    b.record("p", FAIL)
    assert b.state == "open"
    assert len(changes) == 3


def test_one_warning_line_per_state_change_with_the_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    b, clock, _ = make(failures=3, probe=1.0)
    with caplog.at_level(logging.DEBUG, logger="onceq.breaker"):
        for i in range(5):  # two more after it opened (stale calls): no more lines
            b.record(f"m{i}", FAIL)
        clock.now += 1
        b.allow("p1")
        b.allow("x")
        b.record("p1", Outcome(Kind.TRANSIENT, "timeout"))
        clock.now += 2
        b.allow("p2")
        clock.now += 3.25
        b.record("p2", OK)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert lines == [
        (
            logging.WARNING,
            "flow claims: breaker open after 3 transient failures in a row (connect-error);"
            " probing in 1s",
        ),
        (logging.WARNING, "flow claims: breaker half-open: probing with one message"),
        (
            logging.WARNING,
            "flow claims: breaker open again: the probe failed (timeout); probing in 2s",
        ),
        (logging.WARNING, "flow claims: breaker half-open: probing with one message"),
        (logging.WARNING, "flow claims: breaker closed: the probe was answered after 6.2s open"),
    ]
