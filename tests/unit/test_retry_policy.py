"""The retry policy, step by step (docs/architecture.md: the settle table)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceq._core.retry import BreakerPolicy, RetryPolicy, delay_label, parse_duration
from onceq._core.transport import Kind, Settle, decide
from onceq.errors import UsageError


def test_the_default_policy_walks_immediate_then_every_tier_then_dead() -> None:
    p = RetryPolicy()
    steps = [p.decide(Kind.TRANSIENT, attempt) for attempt in range(1, 8)]
    assert steps == [
        (Settle.REQUEUE, 0.0),
        (Settle.DELAY, 5.0),
        (Settle.DELAY, 30.0),
        (Settle.DELAY, 120.0),
        (Settle.DELAY, 600.0),
        (Settle.DEAD, 0.0),
        (Settle.DEAD, 0.0),
    ]
    assert p.max_attempts == 6


@pytest.mark.parametrize("kind", [Kind.SUCCESS, Kind.DUPLICATE])
def test_done_is_acked_at_any_attempt(kind: Kind) -> None:
    for attempt in (1, 3, 99):
        assert RetryPolicy().decide(kind, attempt) == (Settle.ACK, 0.0)


def test_a_rejection_is_dead_at_once_whatever_the_tiers() -> None:
    assert RetryPolicy().decide(Kind.REJECTED, 1) == (Settle.DEAD, 0.0)


def test_held_is_released_and_spends_nothing() -> None:
    assert RetryPolicy().decide(Kind.HELD, 1) == (Settle.RELEASE, 0.0)
    assert RetryPolicy.none().decide(Kind.HELD, 1) == (Settle.RELEASE, 0.0)


@given(
    kind=st.sampled_from([Kind.SUCCESS, Kind.DUPLICATE, Kind.REJECTED, Kind.TRANSIENT]),
    attempt=st.integers(1, 10),
)
def test_the_exercise_policy_is_the_exercise_settle_table(kind: Kind, attempt: int) -> None:
    settle, delay = RetryPolicy.exercise().decide(kind, attempt)
    assert settle is decide(kind, False, attempt, 2)
    assert delay == 0.0


def test_none_dead_letters_the_first_failure() -> None:
    assert RetryPolicy.none().decide(Kind.TRANSIENT, 1) == (Settle.DEAD, 0.0)
    assert RetryPolicy.none().max_attempts == 1


def test_retry_after_skips_the_immediate_retry_and_picks_a_tier_at_least_that_long() -> None:
    p = RetryPolicy()
    assert p.decide(Kind.TRANSIENT, 1, retry_after=7) == (Settle.DELAY, 30.0)
    assert p.decide(Kind.TRANSIENT, 1, retry_after=5) == (Settle.DELAY, 5.0)
    assert p.decide(Kind.TRANSIENT, 1, retry_after=0.5) == (Settle.DELAY, 5.0)
    # never a shorter tier than the attempt itself would take
    assert p.decide(Kind.TRANSIENT, 3, retry_after=1) == (Settle.DELAY, 30.0)
    # longer than every tier: the longest (it never adds attempts)
    assert p.decide(Kind.TRANSIENT, 2, retry_after=3600) == (Settle.DELAY, 600.0)
    # out of attempts: dead, whatever the partner asked
    assert p.decide(Kind.TRANSIENT, 6, retry_after=1) == (Settle.DEAD, 0.0)


def test_retry_after_without_tiers_keeps_the_immediate_retry() -> None:
    assert RetryPolicy.exercise().decide(Kind.TRANSIENT, 1, retry_after=9) == (
        Settle.REQUEUE,
        0.0,
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5s", 5.0), ("2m", 120.0), ("500ms", 0.5), ("1.5h", 5400.0), ("30", 30.0), (3, 3.0)],
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5 minutes", "-1s", "1e3", "s", "nan", True])
def test_bad_durations_are_one_usage_error_naming_what(text: object) -> None:
    with pytest.raises(UsageError, match="retry delay"):
        parse_duration(text, "retry delay")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("seconds", "label"),
    [(5, "5s"), (30, "30s"), (120, "2m"), (600, "10m"), (3600, "1h"), (0.5, "500ms"), (90, "90s")],
)
def test_delay_labels_name_a_queue_exactly(seconds: float, label: str) -> None:
    assert delay_label(seconds) == label
    assert parse_duration(label) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"immediate": -1}, "immediate"),
        ({"immediate": True}, "immediate"),
        ({"delays": (0,)}, "more than 0"),
        ({"delays": ("5s", "5000ms")}, "same"),
        ({"delays": ("soon",)}, "not a duration"),
    ],
)
def test_a_bad_policy_is_refused_in_one_line(kwargs: dict[str, object], why: str) -> None:
    with pytest.raises(UsageError, match=why):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_named_policies() -> None:
    assert RetryPolicy.named("default") == RetryPolicy()
    assert RetryPolicy.named("exercise") == RetryPolicy(1, ())
    assert RetryPolicy.named("none") == RetryPolicy(0, ())
    with pytest.raises(UsageError, match="'often'"):
        RetryPolicy.named("often")


def test_breaker_policy_checks_its_numbers() -> None:
    assert BreakerPolicy(probe="2s", max_probe="1m").max_probe == 60.0
    with pytest.raises(UsageError, match="failures"):
        BreakerPolicy(failures=0)
    with pytest.raises(UsageError, match="max probe"):
        BreakerPolicy(probe="10s", max_probe="1s")
    assert not BreakerPolicy.off().enabled
