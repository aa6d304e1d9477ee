"""What both broker feeds share (onceq._sources.feed.BrokerFeed): the loop's bounds from
the flow's prefetch, the stop's grace from the call's timeout, a check that opens the
transport, consuming between start and one close, the drained/unsettled report."""

from __future__ import annotations

import asyncio

import pytest

from onceq import HttpEffect
from onceq._flows.flow import Flow
from onceq._sources import registry
from onceq._sources.amqp.plugin import RabbitSource
from onceq._sources.feed import BrokerFeed
from onceq._sources.nats.plugin import NatsSource

SHARED = ("max_in_flight", "check", "consuming", "stopped", "report", "aclose", "drive")


def _flows() -> list[Flow]:
    effect = HttpEffect("http://127.0.0.1:9/x", timeout=3.0)
    return [
        Flow("r", RabbitSource("x.in", prefetch=7), effect=effect),
        Flow("n", NatsSource("S", "d", prefetch=7), effect=effect),
    ]


@pytest.mark.parametrize("flow", _flows(), ids=["rabbitmq", "nats"])
def test_each_broker_feed_takes_its_bounds_from_the_flow(flow: Flow) -> None:
    feed = registry.of(flow.source).open(flow, False)
    assert isinstance(feed, BrokerFeed)
    assert feed.max_in_flight(calls=True) == 7 and feed.max_in_flight(calls=False) == 7
    assert feed.max_group == 7
    assert feed.grace == 3.0 + 5.0  # one call's timeout + the commit and settle
    # The shared part is the base's, not a copy in each broker's module.
    for name in SHARED:
        assert name not in vars(type(feed)), f"{type(feed).__name__} redefines {name}"


class _Transport:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.stopped = asyncio.Event()
        self.drained = True
        self.unsettled = 2

    async def open(self) -> None:
        self.calls.append("open")

    async def start(self) -> None:
        self.calls.append("start")

    async def close(self) -> None:
        self.calls.append("close")


class _Src:
    prefetch = 0  # the loop still groups at least one outcome


class _Flow:
    source = _Src()
    effect = None  # no call timeout: the default


@pytest.mark.parametrize("until_empty", [True, False])
def test_a_broker_feed_opens_starts_and_closes_its_transport_once(until_empty: bool) -> None:
    t = _Transport()
    feed = BrokerFeed(t, _Flow(), until_empty)
    assert feed.max_group == 1 and feed.max_in_flight(True) == 0 and feed.grace == 15.0

    async def main() -> None:
        await feed.check()
        async with feed.consuming() as transport:
            assert transport is t and t.calls == ["open", "start"]
            stopped = feed.stopped()
            assert stopped is not None and not stopped()
            t.stopped.set()
            assert stopped()
        await feed.aclose()  # the runner's own close after consuming: not a second one

    asyncio.run(main())
    assert t.calls == ["open", "start", "close"]
    assert feed.report() == {"drained": until_empty, "unsettled": 2, "aborted": False}
