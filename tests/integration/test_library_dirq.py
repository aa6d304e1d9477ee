"""The library's consume loop over a directory queue, as a user's program writes it.

`Consumer(Worker(q), ledger, decode, handler)`: the transport says how many tries a
message gets (a directory queue cannot redeliver: one), so a failing handler's
messages are reported as quarantined, never as "requeued" while their files sit in
error/; and a real (awaiting) handler strands no file in processing/.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from onceq import Consumer, Kind, Ledger
from onceq._core.consumer import Outcome
from onceq._exercise.orders_0_1_0 import MessageSpec, decode
from onceq._sources.dirq.queue import DirQueue
from onceq._sources.dirq.worker import Worker
from support import open_db


def _queue(tmp_path: Path, n: int) -> DirQueue:
    q = DirQueue(tmp_path / "q")
    q.init()
    for i in range(n):
        doc = {"msg_id": f"m-{i}", "order_no": "A", "seq": i + 1, "amount": 1}
        (tmp_path / "q" / "inbox" / f"m-{i}.json").write_text(json.dumps(doc))
    return q


def _run(q: DirQueue, handler) -> dict:  # type: ignore[no-untyped-def]
    spec = MessageSpec()

    async def main() -> dict:  # type: ignore[type-arg]
        with Ledger(q.default_db, source="dirq") as ledger, Worker(q) as worker:
            stats = await Consumer(worker, ledger, lambda d: decode(d, spec), handler).run()
        return stats.as_dict()

    return asyncio.run(main())


@pytest.mark.parametrize("kind", [Kind.TRANSIENT, Kind.REJECTED])
def test_a_failing_handler_quarantines_and_says_so(tmp_path: Path, kind: Kind) -> None:
    q = _queue(tmp_path, 6)

    async def failing(delivery, fields):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        return Outcome(kind, "partner-down")

    stats = _run(q, failing)
    assert (stats["received"], stats["requeued"], stats["dead"]) == (6, 0, 6), stats
    counts = q.counts()
    assert (counts["error"], counts["processing"], counts["inbox"]) == (6, 0, 0), counts
    with open_db(q.default_db) as conn:
        actions = conn.execute("SELECT DISTINCT action FROM failures").fetchall()
    assert actions == [("dead",)]


def test_a_real_handler_strands_nothing(tmp_path: Path) -> None:
    q = _queue(tmp_path, 8)
    calls: list[str] = []

    async def handler(delivery, fields):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.001)
        calls.append(delivery.msg_id)
        return Outcome(Kind.SUCCESS, fields=fields)

    stats = _run(q, handler)
    assert (stats["received"], stats["processed"]) == (8, 8), stats
    assert sorted(calls) == sorted(f"m-{i}" for i in range(8))
    counts = q.counts()
    assert (counts["done"], counts["processing"], counts["inbox"]) == (8, 0, 0), counts
