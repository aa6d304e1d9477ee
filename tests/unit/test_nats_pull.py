"""The NATS puller's reading of a pull request's end, without a server.

nats-server ends a pull request with a status message on the request's inbox: 404 (no
messages now), 408 (the lingering request expired), 100 (an idle heartbeat, not an
end), and others when it refuses the request (409: the consumer was deleted, or a batch
over its MaxRequestBatch; 503: no JetStream). Each decides what the transport does
next: take the copies, linger on the next request, wait and ask again, or say that
nothing came (the end of an --until-empty batch).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from onceq._sources.nats.pull import Puller


@dataclass
class Msg:
    reply: str = ""
    headers: dict[str, str] | None = None


def copy(i: int) -> Msg:
    return Msg(reply=f"$JS.ACK.S.D.1.{i}.{i}.0.0")


def status(code: str) -> Msg:
    return Msg(headers={"Status": code})


@dataclass
class FakeNc:
    published: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)

    def new_inbox(self) -> str:
        return "_INBOX.test"

    async def subscribe(self, subject: str, cb: Any) -> object:
        return object()

    async def publish(self, subject: str, payload: bytes, reply: str = "") -> None:
        self.published.append((subject, json.loads(payload), reply))


def puller() -> tuple[Puller, FakeNc, list[int]]:
    nc = FakeNc()
    woken: list[int] = []
    p = Puller(nc, "INV", "onceq", wait=5.0, wake=lambda: woken.append(1))
    asyncio.run(p.start())
    return p, nc, woken


def arrive(p: Puller, *msgs: Msg) -> None:
    for m in msgs:
        asyncio.run(p._on_msg(m))


def test_a_request_asks_without_waiting_then_lingers_only_after_finding_nothing() -> None:
    p, nc, woken = puller()
    asyncio.run(p.ask(5))
    subject, request, reply = nc.published[-1]
    assert (subject, request, reply) == (
        "$JS.API.CONSUMER.MSG.NEXT.INV.onceq",
        {"batch": 5, "no_wait": True},
        "_INBOX.test",
    )
    arrive(p, copy(1), copy(2), status("404"))  # two of five, then "no more now"
    msgs, ended = p.take()
    assert [m.reply for m in msgs] == [copy(1).reply, copy(2).reply] and ended is None
    assert not p.open and not p.idle and len(woken) == 3
    asyncio.run(p.ask(5))  # it brought some: ask again without waiting
    assert nc.published[-1][1] == {"batch": 5, "no_wait": True}
    arrive(p, status("404"))  # nothing at all
    assert p.take() == ([], None) and p.idle
    asyncio.run(p.ask(5))  # now the request lingers on the server, a little under the wait
    assert nc.published[-1][1] == {"batch": 5, "expires": 5 * 10**9 - 100_000}
    arrive(p, status("100"))  # an idle heartbeat is no end
    assert p.take() == ([], None) and p.open
    arrive(p, status("408"))  # it expired with nothing: said to the caller as ''
    assert p.take() == ([], "") and not p.open and p.idle


def test_a_lingering_request_that_brings_copies_ends_the_idle_spell() -> None:
    p, _nc, _ = puller()
    p.idle = True
    asyncio.run(p.ask(3))
    arrive(p, copy(1), status("408"))
    msgs, ended = p.take()
    assert len(msgs) == 1 and ended is None and not p.idle


@pytest.mark.parametrize("code", ["409", "503"])
def test_a_refused_request_is_said_to_the_caller_and_the_next_asks_at_once(code: str) -> None:
    """A 409 (consumer deleted, batch over MaxRequestBatch) or a 503 (no JetStream) ends
    the request: the transport waits a moment and asks again, without lingering."""
    p, nc, _ = puller()
    p.idle = True
    asyncio.run(p.ask(4))
    arrive(p, status(code))
    assert p.take() == ([], code)
    assert not p.open and not p.idle
    asyncio.run(p.ask(4))
    assert nc.published[-1][1] == {"batch": 4, "no_wait": True}


def test_a_full_batch_ends_the_request_and_a_late_status_is_dropped() -> None:
    p, _nc, _ = puller()
    asyncio.run(p.ask(2))
    arrive(p, copy(1), copy(2))
    msgs, ended = p.take()
    assert len(msgs) == 2 and ended is None and not p.open
    arrive(p, status("409"), status("404"))  # the ends of a request no longer open
    assert p.take() == ([], None) and not p.open


def test_a_message_that_is_no_jetstream_copy_is_dropped_and_pending_gives_back_copies() -> None:
    p, _nc, _ = puller()
    asyncio.run(p.ask(3))
    arrive(p, Msg(reply=""), copy(7), status("100"))
    msgs = p.pending()
    assert [m.reply for m in msgs] == [copy(7).reply] and p.open and p.asked == 2


def test_a_request_whose_end_never_came_is_asked_again_lingering() -> None:
    p, nc, _ = puller()
    asyncio.run(p.ask(3))
    p.lost()
    assert not p.open and p.idle
    asyncio.run(p.ask(3))
    assert "expires" in nc.published[-1][1]
