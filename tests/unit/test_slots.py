"""inflight.Slots: the loop's max_in_flight window (taken per delivery, given back after
its settle), without an event loop turn for a free slot."""

from __future__ import annotations

import asyncio

from onceq._core.inflight import Slots


def test_free_slots_are_taken_at_once_and_counted() -> None:
    slots = Slots(2)
    assert slots.take_now() and slots.take_now()
    assert not slots.take_now()
    assert slots.taken == 2
    slots.release()
    assert slots.taken == 1


def test_a_returned_slot_goes_to_the_first_waiter_not_to_a_later_taker() -> None:
    async def go() -> list[str]:
        slots = Slots(1)
        assert slots.take_now()
        committer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        order: list[str] = []

        async def wait(name: str) -> None:
            assert await slots.take(committer)
            order.append(name)

        first = asyncio.ensure_future(wait("first"))
        second = asyncio.ensure_future(wait("second"))
        await asyncio.sleep(0)
        slots.release()  # handed to the first waiter...
        assert not slots.take_now()  # ...so nobody else finds it free
        await first
        slots.release()
        await second
        assert slots.taken == 1  # the second holds it
        committer.cancel()
        return order

    assert asyncio.run(go()) == ["first", "second"]


def test_a_wait_ends_without_a_slot_when_the_committer_ends() -> None:
    async def go() -> tuple[bool, int]:
        slots = Slots(1)
        assert slots.take_now()
        committer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = asyncio.ensure_future(slots.take(committer))
        await asyncio.sleep(0)
        committer.set_exception(RuntimeError("the ledger failed"))
        got = await waiting
        committer.exception()  # retrieved
        slots.release()  # the gave-up waiter takes nothing: the slot is free again
        return got, slots.taken

    assert asyncio.run(go()) == (False, 0)
