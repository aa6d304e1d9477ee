"""An in-memory transport with broker semantics, for testing the loop without a server.

It behaves like a single queue with manual acks: a requeued (or released) delivery
comes back with `redelivered=True`; a delayed one comes back after `delivery.delay`
seconds, as a new copy (like one from a retry queue); a dead one goes to `dead`; an
acked one to `acked`.
`deliveries()` ends when the queue is empty and nothing is outstanding (every
delivery handed out has been settled), or when `stop()` is called.
`pause()` / `probe()` / `resume()` (the breaker's, onceq._core.transport.Pausable): while
paused nothing is handed out but one copy per `probe()`; `deliveries()` waits
meanwhile (it does not end while the queue holds messages).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import replace

from onceq._core.transport import Delivery, Settle


class MemoryTransport:
    def __init__(self, deliveries: Iterable[Delivery] = ()) -> None:
        self.queue: deque[Delivery] = deque(deliveries)
        self.acked: list[Delivery] = []
        self.dead: list[tuple[Delivery, str]] = []
        self.requeued: list[Delivery] = []
        self.delayed: list[tuple[Delivery, float]] = []
        self.released: list[Delivery] = []
        self._waiting = 0  # delayed copies not yet back: the queue is not drained
        self.settle_calls: list[int] = []  # group sizes, to see batching
        self._outstanding = 0
        self._stopped = False
        self._changed = asyncio.Event()
        self.paused = False
        self._probes = 0  # copies that may still be handed out while paused
        self.pauses = 0  # how many times it was paused, and probes asked: for tests
        self.probes = 0

    def publish(self, body: bytes, msg_id: str | None = None, ref: str | None = None) -> None:
        ref = ref or f"m{len(self.queue) + len(self.acked) + len(self.dead)}"
        self.queue.append(Delivery(body=body, ref=ref, msg_id=msg_id))
        self._changed.set()

    def stop(self) -> None:
        self._stopped = True
        self._changed.set()

    def pause(self) -> None:
        self.paused = True
        self.pauses += 1
        self._probes = 0

    def probe(self) -> None:
        self.probes += 1
        self._probes = 1  # at most one at a time, however often it is asked
        self._changed.set()

    def resume(self) -> None:
        self.paused = False
        self._probes = 0
        self._changed.set()

    async def deliveries(self) -> AsyncIterator[Delivery]:
        while not self._stopped:
            if self.queue and (not self.paused or self._probes):
                if self.paused:
                    self._probes -= 1
                self._outstanding += 1
                yield self.queue.popleft()
                continue
            if not self.queue and self._outstanding == 0 and self._waiting == 0:
                return  # drained (while paused, a queue that holds messages is not)
            self._changed.clear()
            await self._changed.wait()

    async def settle(self, group: Sequence[tuple[Delivery, Settle, str]]) -> None:
        self.settle_calls.append(len(group))
        for d, settle, reason in group:
            self._outstanding -= 1
            if settle is Settle.ACK:
                self.acked.append(d)
            elif settle is Settle.DEAD:
                self.dead.append((d, reason))
            elif settle is Settle.DELAY:
                self.delayed.append((d, d.delay))
                self._waiting += 1
                copy = replace(d, redelivered=False, delay=0.0)
                asyncio.get_running_loop().call_later(d.delay, self._back, copy)
            elif settle is Settle.RELEASE:
                self.released.append(d)
                self.queue.appendleft(replace(d, redelivered=True))
            else:
                self.requeued.append(d)
                # Like a broker: the copy comes back, flagged as possibly seen before.
                self.queue.append(replace(d, redelivered=True))
        self._changed.set()

    def _back(self, d: Delivery) -> None:
        """A delayed copy's time is up: it joins the queue's tail, as from a retry queue."""
        self._waiting -= 1
        self.queue.append(d)
        self._changed.set()
