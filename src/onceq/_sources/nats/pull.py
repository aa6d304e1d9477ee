"""Pull requests of this process's own on a durable pull consumer (NatsTransport's).

Why not nats-py's `PullSubscription.fetch`: it waits for each copy of a batch with
`next_msg`, which makes two asyncio tasks, a timer and a uuid4 (a getrandom system
call) per copy, and takes several turns of the event loop per copy; on a fast partner
that was a large share of a consumer's CPU. Here the copies land in a deque from the
subscription's callback (nats-py parses them as before: `msg.ack()`, `msg.nak()` and
`msg.in_progress()` work as on a fetched copy), and the transport takes every copy
that came in one turn of the loop at once.

The protocol is JetStream's own: a request on $JS.API.CONSUMER.MSG.NEXT.<stream>.<durable>
with this subscription's inbox as its reply subject asks for `batch` copies. As fetch
does, a request first asks without waiting (`no_wait`: the server sends what it has,
then a 404 status when that was fewer than asked); only when one found nothing does the
next one linger (`expires`: the server holds it for PULL_WAIT and ends it with a 408
status, or ends it by filling the batch). One request is outstanding at a time, for at
most the room the transport has, so the copies held never exceed its prefetch.
"""

from __future__ import annotations

import collections
import json
import time
from typing import Any

# The status headers a request's end carries (nats-server's pull protocol).
NO_MESSAGES = "404"
EXPIRED = "408"
HEARTBEAT = "100"
# Seconds past a request's own end before it counts as lost (its status never came: a
# reconnect in between); then the next one is asked for.
GRACE = 2.0


class Puller:
    """One outstanding pull request at a time, and the copies it brought."""

    def __init__(self, nc: Any, stream: str, durable: str, wait: float, wake: Any) -> None:
        self.nc = nc
        self.subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self.wait = wait  # seconds a lingering request waits on the server
        self.wake = wake  # called when something arrived (the transport's event's set)
        self.arrived: collections.deque[Any] = collections.deque()
        self.inbox = ""
        self.sub: Any = None
        self.open = False  # a request is outstanding
        self.asked = 0  # copies the outstanding request may still bring
        self.got = 0  # copies it brought so far
        self.lingering = False  # the outstanding request is a lingering one
        self.idle = False  # the last request found nothing: the next one lingers
        self.deadline = 0.0

    async def start(self) -> None:
        self.inbox = self.nc.new_inbox()
        self.sub = await self.nc.subscribe(self.inbox, cb=self._on_msg)

    async def _on_msg(self, msg: Any) -> None:
        self.arrived.append(msg)
        self.wake()

    async def ask(self, room: int) -> None:
        """Ask for up to `room` copies (no request may be outstanding)."""
        request: dict[str, Any] = {"batch": room}
        if self.idle:
            # A little under the wait, as nats-py does: the server's 408 arrives before
            # the transport's own deadline.
            request["expires"] = int(self.wait * 1e9) - 100_000
        else:
            request["no_wait"] = True
        self.open, self.asked, self.got, self.lingering = True, room, 0, self.idle
        self.deadline = time.monotonic() + (self.wait if self.idle else 0.0) + GRACE
        await self.nc.publish(self.subject, json.dumps(request).encode(), reply=self.inbox)

    def take(self) -> tuple[list[Any], str | None]:
        """(copies arrived, the status that ended the request if one did and was not a
        plain end: '' for a lingering request that brought nothing, else the status)."""
        msgs: list[Any] = []
        ended: str | None = None
        arrived = self.arrived
        while arrived:
            msg = arrived.popleft()
            headers = msg.headers
            status = headers.get("Status") if headers else None
            if status is None:
                if not msg.reply:  # not a JetStream copy: nothing could settle it
                    continue
                msgs.append(msg)
                self.got += 1
                self.asked -= 1
                if self.asked <= 0 and self.open:
                    self.open, self.idle = False, False
                continue
            if status == HEARTBEAT or not self.open:
                continue  # a heartbeat, or a late end of a request given up on
            # The request is over (404: nothing more now; 408: it expired; anything
            # else, a 409 or a 503: the server refused it, said to the caller).
            self.open = False
            if status in (NO_MESSAGES, EXPIRED):
                brought = self.got > 0
                if not brought and self.lingering:
                    ended = ""  # nothing came within the wait
                self.idle = not brought
            else:
                ended = status
                self.idle = False
        return msgs, ended

    def lost(self) -> None:
        """The outstanding request's end never came: ask again (lingering: the server
        may have had nothing, and a lingering request returns copies at once anyway)."""
        self.open, self.idle = False, True

    def pending(self) -> list[Any]:
        """Copies arrived and not taken (statuses dropped): to be given back."""
        msgs, _ = self.take()
        return msgs

    async def unsubscribe(self) -> None:
        if self.sub is not None:
            await self.sub.unsubscribe()
