"""--rate of a dead-letter replay (onceq._sources.pace, onceq._cli.broker_options.Rate):
the one pacer and the one validation both brokers use."""

from __future__ import annotations

import asyncio
import time

import click
import pytest

from onceq._cli.broker_options import Rate
from onceq._sources.pace import Pacer, paced_batch


def test_pacer_spaces_publishes() -> None:
    async def run(n: int, rate: float | None) -> float:
        pacer = Pacer(rate)
        start = time.monotonic()
        for _ in range(n):
            await pacer.wait()
        return time.monotonic() - start

    assert asyncio.run(run(5, 20.0)) >= 4 / 20.0
    assert asyncio.run(run(1, 0.001)) < 0.5  # the first publish is not held back
    assert asyncio.run(run(50, None)) < 0.5


def test_a_paced_replay_records_about_a_second_of_copies_at_a_time() -> None:
    assert paced_batch(None, 500) == 500
    assert paced_batch(50.0, 500) == 50
    assert paced_batch(0.2, 500) == 1  # slower than one a second: one at a time
    assert paced_batch(1e6, 500) == 500


@pytest.mark.parametrize("good", ["0.5", "50", "1e3"])
def test_a_rate_is_a_positive_number(good: str) -> None:
    assert Rate().convert(good, None, None) == float(good)


@pytest.mark.parametrize("bad", ["0", "-3", "nan", "inf", "-inf", "1e400", "abc"])
def test_a_rate_no_pace_can_use_is_refused(bad: str) -> None:
    with pytest.raises(click.BadParameter):
        Rate().convert(bad, None, None)
