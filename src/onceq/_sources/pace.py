"""`--rate N` of a dead-letter replay, shared by every broker (`mq dead replay`, `nats
dead replay`): at most N publishes per second, so a replay of thousands does not hit
a partner that just recovered with all of them at once.

    pacer = Pacer(rate)          # None: no bound (as fast as the broker confirms)
    for letter in chosen:
        await pacer.wait()       # publish i starts no earlier than start + i/rate
        ...publish...

Spaced from the first publish's start, not from the previous one's end, so a slow
confirm does not lower the rate further than it must, and N publishes take at least
(N-1)/rate seconds.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["Pacer", "paced_batch"]


class Pacer:
    """At most `rate` publishes per second: publish i waits until start + i/rate."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self._start: float | None = None
        self._n = 0

    async def wait(self) -> None:
        if self.rate is None:
            return
        now = time.monotonic()
        if self._start is None:
            self._start = now
        due = self._start + self._n / self.rate
        self._n += 1
        if due > now:
            await asyncio.sleep(due - now)


def paced_batch(rate: float | None, most: int) -> int:
    """Letters per ledger transaction: `most`, or about a second of copies when paced
    (a replay killed mid-way leaves at most that many resets with nothing replayed)."""
    return most if rate is None else max(1, min(most, int(rate)))
