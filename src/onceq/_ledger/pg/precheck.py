"""The duplicate pre-check of a loop tick's deliveries in one round trip.

The consume loop asks, for every delivery, whether its msg_id already took effect
(before calling the partner: a duplicate makes no call). On SQLite that read is a
few microseconds in-process; on PostgreSQL it is a network round trip, and the loop
would pay one per message, on the event loop itself. `Precheck` gathers the msg_ids
asked for during one tick of the loop and answers them all with ONE query
(`PgLedger.processed_refs`), run in a worker thread so the loop keeps turning.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable


class Precheck:
    """`await precheck(msg_id)` -> the ref that took effect, '' without one, None unseen."""

    def __init__(self, lookup: Callable[[Iterable[str]], dict[str, str]]) -> None:
        self._lookup = lookup
        self._pending: dict[str, asyncio.Future[str | None]] | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # held: a loop keeps weak references

    async def __call__(self, msg_id: str) -> str | None:
        loop = asyncio.get_running_loop()
        if self._pending is None:
            self._pending = {}
            # After every callback already due this tick: the other deliveries being
            # handled now add their ids first.
            loop.call_soon(self._flush)
        fut = self._pending.get(msg_id)
        if fut is None:
            fut = self._pending[msg_id] = loop.create_future()
        return await asyncio.shield(fut)

    def _flush(self) -> None:
        batch, self._pending = self._pending or {}, None
        task = asyncio.ensure_future(self._answer(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, batch: dict[str, asyncio.Future[str | None]]) -> None:
        try:
            found = await asyncio.to_thread(self._lookup, list(batch))
        except BaseException as exc:  # every waiter gets the ledger's error
            for fut in batch.values():
                if not fut.done():
                    fut.set_exception(exc)
            return
        for msg_id, fut in batch.items():
            if not fut.done():
                fut.set_result(found.get(msg_id))
