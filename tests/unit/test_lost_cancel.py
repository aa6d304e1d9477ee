"""A cancel that lands as a wait's event is set reaches the waiting task (Python 3.11).

`asyncio.wait_for(event.wait(), seconds)` on 3.11 (CPython gh-86296, fixed in 3.12)
returns the event's result and drops a cancel that lands in the same turn of the loop
as the event is set: the task goes on as if never cancelled. `Holds.close` cancels
the prober and the ledger's watcher, which loop until a stop: such a task outlived
its consume loop (pinging a closed ledger, probing a closed transport every interval).
`Stop.sleep` returned "stopped" to a task that was cancelled. Each test sets the
event and cancels the task in one tick (the set first), deterministically.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from onceq._core.breaker import OPEN
from onceq._core.holds import Holds, wait
from onceq._core.outcome import Outcome
from onceq._core.retry import BreakerPolicy
from onceq._core.stop import Stop
from onceq._core.transport import Kind


def test_wait_keeps_a_cancel_that_meets_its_event() -> None:
    async def main() -> None:
        event = asyncio.Event()
        task = asyncio.ensure_future(wait(event, 5.0))
        await asyncio.sleep(0)  # waiting
        event.set()
        task.cancel()
        await asyncio.wait({task}, timeout=2.0)
        assert task.cancelled()

    asyncio.run(main())


def test_stop_sleep_keeps_a_cancel_that_meets_the_stop() -> None:
    async def main() -> None:
        stop = Stop()
        task = asyncio.ensure_future(stop.sleep(5.0))
        await asyncio.sleep(0)
        stop.request()
        task.cancel()
        await asyncio.wait({task}, timeout=2.0)
        assert task.cancelled()

    asyncio.run(main())


class _Pausable:
    def __init__(self) -> None:
        self.probes = 0

    def pause(self) -> None:
        pass

    def probe(self) -> None:
        self.probes += 1

    def resume(self) -> None:
        pass


def _ledger(pings: list[int]) -> Any:
    def ping() -> bool:
        pings.append(1)
        return False  # still away

    return SimpleNamespace(flow="f", path="x.db", ping=ping)


def test_close_ends_the_ledger_watcher_when_its_cancel_meets_a_wake() -> None:
    async def main() -> None:
        pings: list[int] = []
        holds = Holds(_Pausable(), _ledger(pings), BreakerPolicy.off(), calls=False)
        holds.start(lambda _task: None)
        holds.ledger_lost(ConnectionError("gone"))
        await asyncio.sleep(0)  # the watcher waits for its next ping
        (watcher,) = holds._tasks
        holds._wake_up()  # a wake (a breaker's change) in the tick the loop closes
        holds.close()
        await asyncio.wait({watcher}, timeout=1.0)
        assert watcher.done(), "the watcher outlived close(): it lost its cancel"
        assert pings == []

    asyncio.run(main())


def test_close_ends_the_prober_when_its_cancel_meets_a_wake() -> None:
    async def main() -> None:
        transport = _Pausable()
        policy = BreakerPolicy(failures=1, probe=0.2, max_probe=0.2)
        holds = Holds(transport, _ledger([]), policy, calls=True)
        holds.start(lambda _task: None)
        assert holds.breaker is not None
        holds.breaker.record("m1", Outcome(Kind.TRANSIENT, "connect-error"))
        assert holds.breaker.state == OPEN
        await asyncio.sleep(0)  # the prober waits for the probe's time
        (prober,) = holds._tasks
        holds._wake_up()
        holds.close()
        await asyncio.wait({prober}, timeout=1.0)
        assert prober.done(), "the prober outlived close(): it lost its cancel"
        assert transport.probes == 0

    asyncio.run(main())
