"""The SQLite ledger's duplicate check on the loop: one tick's ids, one read.

`Ledger.aprocessed_ref` gathers the ids the loop asks for during one tick and answers
them with one query at the end of that tick. What must not change: every copy gets
its own id's answer (a ref, '' or None), a row committed by another process before
the read is found, and a read that fails fails every copy that waited on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path

import pytest

from onceq._core.transport import Delivery, Kind, Settle
from onceq._ledger.sqlite import Entry, Ledger
from onceq.errors import LedgerError


def success(msg_id: str, ref: str) -> Entry:
    d = Delivery(body=b"{}", ref=ref, msg_id=msg_id, stable_ref=True)
    return Entry(d, Kind.SUCCESS, Settle.ACK, fields={"group": "A", "seq": 1})


def spy(ledger: Ledger) -> list[list[str]]:
    """The reads the ledger makes: each a list of the ids it looked up."""
    reads: list[list[str]] = []
    one, many = ledger.processed_ref, ledger.processed_refs

    def processed_ref(msg_id: str) -> str | None:
        reads.append([msg_id])
        return one(msg_id)

    def processed_refs(msg_ids: Iterable[str]) -> dict[str, str]:
        ids = list(msg_ids)
        reads.append(ids)
        return many(ids)

    ledger.processed_ref = processed_ref  # type: ignore[method-assign]
    ledger.processed_refs = processed_refs  # type: ignore[method-assign]
    return reads


def test_one_ticks_checks_are_one_read_and_each_gets_its_own_answer(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db", "amqp") as ledger:
        ledger.commit([success("m1", "q/one"), success("m2", "q/two")])
        reads = spy(ledger)

        async def main() -> list[str | None]:
            return await asyncio.gather(*(ledger.aprocessed_ref(m) for m in ("m1", "m3", "m2")))

        assert asyncio.run(main()) == ["q/one", None, "q/two"]
        assert reads == [["m1", "m3", "m2"]]


def test_a_check_in_a_later_tick_reads_again_and_finds_a_row_committed_between(
    tmp_path: Path,
) -> None:
    """No answer is kept from one tick to the next: a twin elsewhere may commit meanwhile."""
    path = tmp_path / "l.db"
    with Ledger(path, "amqp") as ledger, Ledger(path, "amqp") as elsewhere:
        reads = spy(ledger)

        async def main() -> tuple[str | None, str | None]:
            before = await ledger.aprocessed_ref("m1")
            elsewhere.commit([success("m1", "q/theirs")])  # another consumer's commit
            return before, await ledger.aprocessed_ref("m1")

        assert asyncio.run(main()) == (None, "q/theirs")
        assert reads == [["m1"], ["m1"]]


def test_a_failed_read_fails_every_check_that_waited_on_it(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db", "amqp") as ledger:

        def broken(msg_ids: Iterable[str]) -> dict[str, str]:
            raise LedgerError(f"{ledger.path}: read failed: disk I/O error")

        ledger.processed_refs = broken  # type: ignore[method-assign]

        async def main() -> list[object]:
            return await asyncio.gather(
                *(ledger.aprocessed_ref(m) for m in ("m1", "m2")), return_exceptions=True
            )

        results = asyncio.run(main())
        assert [type(r) for r in results] == [LedgerError, LedgerError]


def test_a_check_cancelled_before_the_read_leaves_the_others_answered(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db", "amqp") as ledger:
        ledger.commit([success("m2", "q/two")])

        async def main() -> str | None:
            gone = asyncio.ensure_future(ledger.aprocessed_ref("m1"))
            kept = asyncio.ensure_future(ledger.aprocessed_ref("m2"))
            await asyncio.sleep(0)  # both are waiting for the tick's read
            gone.cancel()
            with pytest.raises(asyncio.CancelledError):
                await gone
            return await kept

        assert asyncio.run(main()) == "q/two"
