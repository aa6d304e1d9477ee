"""Waiting for an event with a time limit, without losing a cancel.

asyncio.timeout, never `asyncio.wait_for(event.wait(), seconds)`: on Python 3.11
wait_for runs the wait in a task of its own and, when a cancel lands in the turn that
task ends (the event set as the loop closes), returns its result and drops the cancel
(CPython gh-86296, fixed in 3.12). A task that loops until it is cancelled (a breaker's
prober, the ledger's watcher, a depth reader, the heartbeat) then outlived its loop,
and a close that awaited it hung. Awaited in the calling task, the cancel reaches the
wait whatever else is due (tests/unit/test_lost_cancel.py; tests/unit/test_waits.py
keeps the pattern out of the package).
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["wait"]


async def wait(event: asyncio.Event, seconds: float | None) -> bool:
    """Until `event` is set or `seconds` pass (None: no limit); whether it is set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
    return event.is_set()
