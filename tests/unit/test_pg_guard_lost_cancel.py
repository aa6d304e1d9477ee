"""PgGuard.aclose ends its flusher even when Python 3.11 loses the close's cancel.

`asyncio.wait_for` on 3.11 (CPython gh-86296, fixed in 3.12) returns its inner
result and drops a cancel that lands in the same turn of the loop as that result:
the flusher, cancelled by `aclose` just as a batch's answer came in, went back to
waiting for work for ever, and `aclose` (awaiting it) with it: a run that never
ended, idle (seen in CI as test_status[postgresql] hanging). The test builds that
turn deterministically: the batch's answer and the close are scheduled in the same
tick, the answer first. No server: the guard's connection and its query are stubs.
"""

from __future__ import annotations

import asyncio
from typing import Any

from onceq._ledger.pg.guard import PgGuard


def test_close_ends_the_flusher_when_the_cancel_meets_a_batchs_answer() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        g = PgGuard("postgresql://127.0.0.1:1/none", "f")
        sending: asyncio.Future[None] = loop.create_future()
        answer: asyncio.Future[tuple[set[str], None]] = loop.create_future()

        async def connection() -> Any:
            return object()

        async def send(conn: Any, releases: list[str], claims: list[Any]) -> Any:
            sending.set_result(None)
            return await answer

        g._connection = connection  # type: ignore[method-assign]
        g._send = send  # type: ignore[method-assign]
        claim = asyncio.ensure_future(g.claim("m1"))
        await sending  # the flusher waits for the batch's answer (under its timeout)
        # One tick: the answer wakes the query first, then the close cancels the
        # flusher (wait_for's inner task is done by the time the flusher steps).
        answer.set_result((set(), None))
        closer = asyncio.ensure_future(g.aclose())
        done, _ = await asyncio.wait({closer}, timeout=2.0)
        task = g._task
        assert closer in done, "aclose hung: the flusher lost its cancel"
        assert task is not None and task.done()
        assert await claim is None  # the batch's answer was still given

    asyncio.run(main())
