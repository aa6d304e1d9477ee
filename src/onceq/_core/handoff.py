"""The committer's inbox: what the handlers hand to the group commit, in their order.

asyncio.Queue does the same job with about ten Python-level calls per item (the
bound check, the unfinished-task count, its `finished` event, the getters'
wake-ups), paid once per message by every source. Here one reader (the committer)
and any number of writers on the loop's thread: a deque and at most one waiting
future.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

__all__ = ["Handoff"]


class Handoff:
    """An unbounded FIFO with one awaiting reader (the interface of asyncio.Queue's
    `put_nowait`, `get`, `get_nowait` and `empty` that the committer uses)."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():  # a reader cancelled meanwhile takes nothing
                waiter.set_result(None)

    async def get(self) -> Any:
        while not self._items:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                if self._waiter is waiter:
                    self._waiter = None
        return self._items.popleft()

    def get_nowait(self) -> Any:
        """The oldest item; IndexError when there is none (ask `empty()` first)."""
        return self._items.popleft()

    def empty(self) -> bool:
        return not self._items
