"""The SQLite group commit's dedup insert: plain first, RETURNING only for a group it refuses.

The plain multi-row INSERT (`SqliteCommit._insert_rows`) must give every verdict the
RETURNING path gave: a row already there or a second copy in the group makes the
statement fail as a whole, undone alone, and that group goes the old way.
"""

from __future__ import annotations

from pathlib import Path

from onceq._core.transport import Delivery, Kind, Settle
from onceq._ledger.sqlite import Entry, Ledger
from onceq._ledger.sqlite_commit import EXACT_ROWS


def success(msg_id: str, ref: str) -> Entry:
    return Entry(Delivery(b"{}", ref, msg_id, stable_ref=True), Kind.SUCCESS, Settle.ACK)


def inserts(ledger: Ledger, group: list[Entry]) -> list[str]:
    seen: list[str] = []
    ledger._write.set_trace_callback(seen.append)
    try:
        ledger.commit(group)
    finally:
        ledger._write.set_trace_callback(None)
    return [s for s in seen if s.lstrip().upper().startswith("INSERT INTO MESSAGES")]


def test_a_group_of_new_rows_is_one_plain_insert(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        group = [success(f"m{i}", f"{i}.json") for i in range(11)]
        sent = inserts(ledger, group)
        assert len(sent) == 1 and "RETURNING" not in sent[0]
        assert all(e.kind is Kind.SUCCESS for e in group)
        assert ledger.counts()["processed"] == 11


def test_a_row_already_there_sends_the_group_the_returning_way(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        ledger.commit([success("m1", "old.json")])
        group = [success("m0", "0.json"), success("m1", "1.json"), success("m2", "2.json")]
        sent = inserts(ledger, group)
        assert "RETURNING" in sent[-1]  # the plain one failed and was undone alone
        assert [e.kind for e in group] == [Kind.SUCCESS, Kind.DUPLICATE, Kind.SUCCESS]
        assert group[1].settle is Settle.ACK
        assert ledger.processed_ref("m1") == "old.json"
        counts = ledger.counts()
        assert (counts["processed"], counts["duplicates"]) == (3, 1)


def test_two_copies_in_one_group_send_it_the_returning_way(tmp_path: Path) -> None:
    n = EXACT_ROWS
    with Ledger(tmp_path / "l.db") as ledger:
        group = [success(f"m{i}", f"{i}.json") for i in range(n - 1)]
        group.append(success(f"m{n - 2}", "again.json"))  # a second copy in the group
        sent = inserts(ledger, group)
        assert "RETURNING" not in sent[0] and "RETURNING" in sent[-1]
        assert [e.kind for e in group].count(Kind.DUPLICATE) == 1
        assert group[-1].kind is Kind.DUPLICATE and group[-2].kind is Kind.SUCCESS
        assert ledger.counts()["processed"] == n - 1
        assert ledger.processed_ref(f"m{n - 2}") == f"{n - 2}.json"


def test_a_group_over_exact_rows_goes_the_returning_way_at_once(tmp_path: Path) -> None:
    # Measured slower plain for the directory queue's large groups (sqlite_commit).
    with Ledger(tmp_path / "l.db") as ledger:
        group = [success(f"m{i}", f"{i}.json") for i in range(EXACT_ROWS + 1)]
        sent = inserts(ledger, group)
        assert sent and all("RETURNING" in s for s in sent)
        assert ledger.counts()["processed"] == EXACT_ROWS + 1
