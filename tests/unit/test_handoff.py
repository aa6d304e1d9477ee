"""The committer's inbox (onceq._core.handoff): order, waking, and a cancelled reader."""

from __future__ import annotations

import asyncio

import pytest

from onceq._core.handoff import Handoff


def test_items_come_out_in_the_order_they_went_in() -> None:
    async def main() -> list[int]:
        h = Handoff()
        for i in range(5):
            h.put_nowait(i)
        out = [await h.get()]
        while not h.empty():
            out.append(h.get_nowait())
        return out

    assert asyncio.run(main()) == [0, 1, 2, 3, 4]


def test_a_waiting_reader_wakes_on_the_next_put() -> None:
    async def main() -> tuple[bool, object]:
        h = Handoff()
        reader = asyncio.ensure_future(h.get())
        await asyncio.sleep(0)
        waited = not reader.done()
        h.put_nowait("x")
        return waited, await asyncio.wait_for(reader, 1)

    assert asyncio.run(main()) == (True, "x")


def test_a_cancelled_reader_loses_nothing_put_after_it() -> None:
    async def main() -> object:
        h = Handoff()
        reader = asyncio.ensure_future(h.get())
        await asyncio.sleep(0)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        h.put_nowait("kept")
        return await asyncio.wait_for(h.get(), 1)

    assert asyncio.run(main()) == "kept"


def test_get_nowait_on_an_empty_handoff_raises() -> None:
    with pytest.raises(IndexError):
        Handoff().get_nowait()
