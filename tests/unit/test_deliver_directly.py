"""received.deliver_directly against a stand-in for aiormq's Channel (no broker).

What it must keep of aiormq's behaviour: frames read in order (header, then body),
another tag's or a cancelled consumer's deliveries left to aiormq, a failing callback
logged and never raised into the reader, an async callback still awaited in a task.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

import pytest
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from onceq._sources.amqp.received import deliver_directly


class FakeChannel:
    """aiormq's Channel as deliver_directly uses it: frames come from a list."""

    def __init__(self, frames: list[Any]) -> None:
        self.frames = frames
        self.consumers: dict[str, Any] = {}
        self.aiormq_path: list[Any] = []  # deliveries aiormq's own code handled
        self.tasks: list[asyncio.Task[Any]] = []

    async def _get_frame(self) -> Any:
        return self.frames.pop(0)

    async def _read_content(self, frame: Any, header: Any) -> Any:
        body = await self._get_frame()
        return {"tag": frame.delivery_tag, "body": body.value}

    async def _on_deliver_frame(self, frame: Any) -> None:
        await self._get_frame()  # aiormq reads the header and body itself
        await self._get_frame()
        self.aiormq_path.append(frame.delivery_tag)

    def create_task(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.append(task)
        return task

    @staticmethod
    def _on_consumer_done(task: asyncio.Task[Any]) -> None:
        pass


def deliver(tag: int, consumer: str) -> list[Any]:
    """The three frames of one delivery."""
    return [
        commands.Basic.Deliver(consumer_tag=consumer, delivery_tag=tag, routing_key="q"),
        ContentHeader(body_size=2, properties=commands.Basic.Properties(message_id=str(tag))),
        ContentBody(b"{}"),
    ]


async def read_all(channel: FakeChannel) -> None:
    """The reader: the method frames in order, as aiormq's `_reader` dispatches them."""
    while channel.frames:
        await channel._on_deliver_frame(channel.frames.pop(0))


def test_our_deliveries_come_in_the_reader_in_order_and_others_go_aiormqs_way() -> None:
    got: list[Any] = []
    channel = FakeChannel([*deliver(1, "ours"), *deliver(2, "theirs"), *deliver(3, "ours")])
    channel.consumers = {"ours": object(), "theirs": object()}
    assert deliver_directly(channel, "ours", got.append)
    asyncio.run(read_all(channel))
    assert [m["tag"] for m in got] == [1, 3]
    assert channel.aiormq_path == [2]
    assert channel.tasks == []  # no task per delivery


def test_a_cancelled_consumers_delivery_is_left_to_aiormq() -> None:
    got: list[Any] = []
    channel = FakeChannel(deliver(1, "ours"))
    deliver_directly(channel, "ours", got.append)
    channel.consumers = {}  # cancelled: aiormq drops its deliveries (they stay unacked)
    asyncio.run(read_all(channel))
    assert got == []
    assert channel.aiormq_path == [1]


def test_a_failing_callback_is_logged_and_the_reader_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    got: list[Any] = []

    def callback(message: Any) -> None:
        if message["tag"] == 1:
            raise RuntimeError("boom")
        got.append(message)

    channel = FakeChannel([*deliver(1, "ours"), *deliver(2, "ours")])
    channel.consumers = {"ours": callback}
    deliver_directly(channel, "ours", callback)
    with caplog.at_level(logging.ERROR):
        asyncio.run(read_all(channel))
    assert [m["tag"] for m in got] == [2]
    assert "Consumer callback failed" in caplog.text


def test_an_async_callback_is_awaited_in_a_task_as_aiormq_would() -> None:
    got: list[Any] = []

    async def callback(message: Any) -> None:
        got.append(message)

    async def run() -> None:
        await read_all(channel)
        await asyncio.gather(*channel.tasks)

    channel = FakeChannel(deliver(1, "ours"))
    channel.consumers = {"ours": callback}
    deliver_directly(channel, "ours", callback)
    asyncio.run(run())
    assert [m["tag"] for m in got] == [1]
    assert len(channel.tasks) == 1


def test_a_channel_without_the_parts_is_left_alone() -> None:
    class Other:
        consumers: ClassVar[dict[str, Any]] = {}

    assert not deliver_directly(Other(), "ours", print)


def test_a_new_tag_forgets_the_cancelled_ones() -> None:
    channel = FakeChannel([])
    channel.consumers = {"a": object()}
    deliver_directly(channel, "a", print)
    channel.consumers = {"b": object()}  # a drain check consumed again under a new tag
    deliver_directly(channel, "b", print)
    assert set(channel._onceq_direct) == {"b"}  # type: ignore[attr-defined]
