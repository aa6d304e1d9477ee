"""The RabbitMQ transport's pause / probe / resume (what the breaker drives), on the broker.

While paused nothing may sit prefetched (no consumer on the queue, nothing unacked),
a probe hands out exactly one message, resume consumes again, and a batch
(--until-empty) is not over while paused.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

# exact=True: a probe's basic.get message is unacked with no consumer registered, which
# only rabbitmqctl counts (tests/mq_support.queues).
from mq_support import cli, consumers, queues
from onceq._core.transport import Delivery, Settle
from onceq._sources.amqp.transport import AmqpTransport

pytestmark = pytest.mark.broker


def _publish(url: str, n: int, start: int = 0) -> None:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(start, start + n):
            ch.basic_publish(
                "",
                "claim.in",
                f'{{"guid": "g{i}"}}'.encode(),
                pika.BasicProperties(message_id=f"g{i}", delivery_mode=2),
            )
    finally:
        conn.close()


async def _until(predicate: Any, timeout: float = 15) -> None:
    """Poll the broker (rabbitmqctl, in a thread) until `predicate()` holds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await asyncio.to_thread(predicate):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("the broker never reached the state")
        await asyncio.sleep(0.1)


async def _next(it: AsyncIterator[Delivery], timeout: float = 10) -> Delivery:
    return await asyncio.wait_for(it.__anext__(), timeout)


async def _all(deliveries: AsyncIterator[Delivery]) -> list[Delivery]:
    return [d async for d in deliveries]


@pytest.fixture
def url(amqp_url: str) -> str:
    r = cli(amqp_url, "mq", "topology", "--retry", "exercise")
    assert r.returncode == 0, r.stderr
    return amqp_url


def test_pause_returns_what_was_prefetched_probe_takes_one_resume_consumes(url: str) -> None:
    _publish(url, 10)

    async def scenario() -> list[str]:
        t = AmqpTransport(url, prefetch=3)
        await t.open()
        await t.start()
        it = t.deliveries().__aiter__()
        done: list[str] = []
        try:
            first = await _next(it)
            await _until(lambda: queues(url, exact=True)["claim.in"] == (10, 3))  # prefetch 3 out
            t.pause()
            # The loop gives back what it holds (the breaker's RELEASE: untried).
            await t.settle([(first, Settle.RELEASE, "")])
            while t._held:
                await t.settle([(await _next(it), Settle.RELEASE, "")])
            # Nothing sits prefetched while paused: no consumer, nothing unacked; what
            # arrived for the cancelled consumer was given back by the recover.
            await _until(
                lambda: consumers(url) == 0 and queues(url, exact=True)["claim.in"] == (10, 0)
            )
            # A probe: exactly one message, by basic.get, no consumer.
            t.probe()
            probe = await _next(it)
            await _until(lambda: queues(url, exact=True)["claim.in"] == (10, 1))
            assert consumers(url) == 0 and t._buffer.empty()
            await t.settle([(probe, Settle.ACK, "")])
            done.append(probe.headers["message_id"])
            # Resume: a consumer again, the rest flows.
            t.resume()
            while len(done) < 10:
                d = await _next(it)
                await t.settle([(d, Settle.ACK, "")])
                done.append(d.headers["message_id"])
            await _until(
                lambda: queues(url, exact=True)["claim.in"] == (0, 0) and consumers(url) == 1
            )
        finally:
            t.stop()
            await t.close()
        return done

    done = asyncio.run(scenario())
    assert sorted(done) == sorted(f"g{i}" for i in range(10))  # each once: none lost


def test_a_probe_on_an_empty_queue_takes_the_next_message_that_arrives(url: str) -> None:
    async def scenario() -> str:
        t = AmqpTransport(url, prefetch=2)
        await t.open()
        await t.start()
        it = t.deliveries().__aiter__()
        try:
            t.pause()
            await _until(lambda: consumers(url) == 0)
            t.probe()
            # Nothing to take yet (a partner outage empties the queue into the tiers).
            await asyncio.to_thread(_publish, url, 3)
            d = await _next(it)
            await _until(lambda: queues(url, exact=True)["claim.in"] == (3, 1))  # one, not three
            await t.settle([(d, Settle.RELEASE, "")])
            await _until(lambda: queues(url, exact=True)["claim.in"] == (3, 0))
            return str(d.headers["message_id"])
        finally:
            t.stop()
            await t.close()

    assert asyncio.run(scenario()) == "g0"  # released to the head, in order


def test_a_batch_is_not_drained_while_paused(url: str) -> None:
    async def scenario() -> bool:
        t = AmqpTransport(url, prefetch=2, until_empty=True)
        await t.open()
        await t.start()
        # Iterated in a task of its own: cancelling an async generator mid-step ends it.
        batch = asyncio.create_task(_all(t.deliveries()))
        try:
            t.pause()
            await _until(lambda: consumers(url) == 0)
            # The queue is empty and nothing is held: drained, were it not paused.
            done, _ = await asyncio.wait([batch], timeout=2)
            assert not done and not t.drained
            t.resume()
            assert await asyncio.wait_for(batch, 10) == []
            return t.drained
        finally:
            t.stop()
            await t.close()

    assert asyncio.run(scenario()) is True
