"""Helpers for the NATS tests: the machine's shared JetStream server, names of one's own.

The shared server (127.0.0.1:4222, or ONCEQ_NATS_URL) is never stopped or restarted
here: each test takes unique stream, subject and durable names (`nats_names`) and
deletes its streams afterwards (their consumers go with them). Without a server the
test fails under CI=true (a missing server must not pass as green) and is skipped
elsewhere. A test that kills a server starts its own (not here).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest

URL = os.environ.get("ONCEQ_NATS_URL") or "nats://127.0.0.1:4222"


def server_answers(url: str = URL) -> bool:
    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 4222), 2).close()
        return True
    except OSError:
        return False


@dataclass(frozen=True)
class Names:
    """One test's stream, subject, durable consumer and dead-letter subject."""

    url: str
    stream: str
    subject: str
    durable: str

    @property
    def dead_stream(self) -> str:
        return f"{self.stream}_DEAD"

    @property
    def dead_subject(self) -> str:
        return f"onceq.dead.{self.stream}"

    def setup_args(self) -> list[str]:
        return ["--stream", self.stream, "--subject", self.subject, "--durable", self.durable]


async def _js(url: str) -> tuple[Any, Any]:
    import nats

    nc = await nats.connect(url)
    return nc, nc.jetstream()


async def _delete(url: str, streams: list[str]) -> None:
    import nats.js.errors as jse

    nc, js = await _js(url)
    try:
        for name in streams:
            with contextlib.suppress(jse.NotFoundError):
                await js.delete_stream(name)
    finally:
        await nc.close()


@pytest.fixture(name="nats_names")
def nats_names_fixture() -> Iterator[Names]:
    """Names of one's own on the shared server; their streams deleted afterwards.

    A test module imports `nats_names_fixture` and asks for `nats_names`."""
    if not server_answers():
        msg = f"NATS JetStream is not answering at {URL}"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    tag = uuid.uuid4().hex[:10]
    names = Names(URL, f"T{tag}", f"onceq.test.{tag}", f"d{tag}")
    try:
        yield names
    finally:
        asyncio.run(_delete(URL, [names.stream, names.dead_stream]))


def setup(names: Names, **kw: Any) -> None:
    """The flow's stream, dead-letter stream and consumer, as `onceq nats setup` makes them."""
    from onceq._sources.nats.setup import Setup
    from onceq._sources.nats.setup import setup as do_setup

    asyncio.run(do_setup(names.url, Setup(names.stream, names.subject, names.durable, **kw)))


async def apublish(names: Names, items: list[tuple[bytes, dict[str, str]]]) -> list[Any]:
    nc, js = await _js(names.url)
    try:
        return [await js.publish(names.subject, body, headers=h) for body, h in items]
    finally:
        await nc.close()


def publish(names: Names, items: list[tuple[bytes, dict[str, str]]]) -> list[Any]:
    """Publish (body, headers) pairs to the test's subject; their PubAcks."""
    return asyncio.run(apublish(names, items))


async def aconsumer_state(names: Names) -> dict[str, int]:
    nc, js = await _js(names.url)
    try:
        info = await js.consumer_info(names.stream, names.durable)
        dead = await js.stream_info(names.dead_stream)
        work = await js.stream_info(names.stream)
        return {
            "pending": info.num_pending or 0,
            "ack_pending": info.num_ack_pending or 0,
            "redelivering": info.num_redelivered or 0,
            "stored": work.state.messages,
            "dead": dead.state.messages,
        }
    finally:
        await nc.close()


def consumer_state(names: Names) -> dict[str, int]:
    """The durable consumer's counts and the messages its two streams hold."""
    return asyncio.run(aconsumer_state(names))


async def astored(url: str, stream: str) -> list[tuple[bytes, dict[str, str]]]:
    """Every message a stream holds (body, headers), read in place by sequence."""
    import nats.js.errors as jse

    nc, js = await _js(url)
    try:
        out = []
        info = await js.stream_info(stream)
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            if info.state.messages == 0:
                break
            try:
                msg = await js.get_msg(stream, seq)
            except jse.NotFoundError:  # acked (work-queue retention) or purged: a gap
                continue
            out.append((msg.data or b"", dict(msg.headers or {})))
        return out
    finally:
        await nc.close()


async def adead_letters(names: Names) -> list[tuple[bytes, dict[str, str]]]:
    """Every dead letter (body, headers), read in place."""
    return await astored(names.url, names.dead_stream)


def dead_letters(names: Names) -> list[tuple[bytes, dict[str, str]]]:
    return asyncio.run(adead_letters(names))


def stored(names: Names) -> list[tuple[bytes, dict[str, str]]]:
    """Every message still in the work stream (unacked or not yet delivered)."""
    return asyncio.run(astored(names.url, names.stream))
