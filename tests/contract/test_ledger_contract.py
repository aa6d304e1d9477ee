"""The ledger contract, held by both kinds: an SQLite file and a PostgreSQL database.

Every test takes `ledger_target` (a path, then a URL) and opens it with
`open_ledger`, so what is proved here holds for whichever ledger a flow names.
SQLite internals (pragmas, statement texts, file layout) are tested in
tests/unit/test_ledger*.py; PostgreSQL's own (schema, sessions, reconnects) in
tests/unit/test_pg_*.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from onceq.errors import LedgerError, NotFound, UsageError
from onceq.ledger import Entry
from onceq.ledger_target import is_pg_url, open_ledger
from onceq.processed_table import PROCESSED_TABLE
from onceq.transport import Delivery, Kind, Settle


def success(msg_id: str, ref: str, stable: bool = True, **fields: Any) -> Entry:
    d = Delivery(body=b"{}", ref=ref, msg_id=msg_id, stable_ref=stable)
    kept = {"amount": fields.pop("amount")} if "amount" in fields else {}
    return Entry(
        d, Kind.SUCCESS, Settle.ACK, fields={"group": "A", "seq": 1, "kept": kept, **fields}
    )


def failure(msg_id: str, ref: str, reason: str = "http-503", settle: Settle = Settle.DEAD) -> Entry:
    kind = Kind.REJECTED if settle is Settle.DEAD and reason != "http-503" else Kind.TRANSIENT
    return Entry(Delivery(b"{}", ref, msg_id), kind, settle, reason)


def test_kind_and_the_name_it_is_reported_by(ledger_target: str) -> None:
    with open_ledger(ledger_target) as ledger:
        assert ledger.kind == ("postgresql" if is_pg_url(ledger_target) else "sqlite")
        assert ledger.created
        assert str(ledger.path) == ledger_target  # no password in these URLs: as given
    with open_ledger(ledger_target, create=False) as again:
        assert not again.created


def test_a_missing_ledger_without_create_is_not_found_and_nothing_is_made(
    ledger_target: str,
) -> None:
    with pytest.raises(NotFound):
        open_ledger(ledger_target, create=False)
    with open_ledger(ledger_target) as ledger:  # still new: the refused open made nothing
        assert ledger.created


def test_second_copy_in_one_group_becomes_a_duplicate(ledger_target: str) -> None:
    with open_ledger(ledger_target) as ledger:
        a, b = success("m1", "a.json"), success("m1", "b.json")
        ledger.commit([a, b])
        assert (a.kind, b.kind) == (Kind.SUCCESS, Kind.DUPLICATE)
        assert b.settle is Settle.ACK
        assert ledger.counts()["processed"] == 1
        assert ledger.processed_ref("m1") == "a.json"
        assert ledger.processed_ref("m2") is None


def test_a_later_group_refuses_the_second_copy(ledger_target: str) -> None:
    with open_ledger(ledger_target) as ledger:
        first = [success(f"m{i}", f"{i}.json") for i in range(300)]
        ledger.commit(first)
        assert all(e.kind is Kind.SUCCESS for e in first)
        again = [success(f"m{i}", f"x{i}.json") for i in range(290, 310)]
        ledger.commit(again)
        assert [e.kind for e in again] == [Kind.DUPLICATE] * 10 + [Kind.SUCCESS] * 10
        assert ledger.counts() == {"processed": 310, "duplicates": 10, "failures": 0, "replays": 0}
        assert ledger.duplicate_ids() == [f"m{i}" for i in range(290, 300)]


def test_duplicates_are_recorded_once_per_copy(ledger_target: str) -> None:
    with open_ledger(ledger_target) as ledger:
        ledger.commit([success("m1", "a.json")])
        for _ in range(2):  # the same copy seen twice (a crash before its move)
            d = Delivery(b"{}", "b.json", "m1", stable_ref=True)
            ledger.commit([Entry(d, Kind.DUPLICATE, Settle.ACK)])
        assert ledger.duplicate_ids() == ["m1"]
        assert ledger.counts()["duplicates"] == 1


def test_a_copy_whose_row_names_it_is_recovered_not_duplicate(ledger_target: str) -> None:
    with open_ledger(ledger_target) as ledger:
        ledger.commit([success("m1", "a.json")])
        d = Delivery(b"{}", "a.json", "m1", stable_ref=True, redelivered=True)
        e = Entry(d, Kind.SUCCESS, Settle.ACK)
        ledger.commit([e])
        assert (e.kind, e.recovered) == (Kind.DUPLICATE, True)
        assert ledger.duplicate_ids() == []


def test_a_new_copy_that_only_shares_the_name_is_a_duplicate(ledger_target: str) -> None:
    with open_ledger(ledger_target) as ledger:
        ledger.commit([success("m1", "a.json")])
        e = success("m1", "a.json")  # not redelivered: never claimed before
        ledger.commit([e])
        assert (e.kind, e.recovered) == (Kind.DUPLICATE, False)
        assert ledger.duplicate_ids() == ["m1"]


def test_unstable_refs_never_count_as_recovered(ledger_target: str) -> None:
    with open_ledger(ledger_target, source="amqp") as ledger:
        ledger.commit([success("m1", "tag-1", stable=False)])
        e = Entry(Delivery(b"{}", "tag-1", "m1", redelivered=True), Kind.DUPLICATE, Settle.ACK)
        ledger.commit([e])
        assert not e.recovered
        assert ledger.duplicate_ids() == ["m1"]


def test_a_failure_a_crashed_run_recorded_is_not_recorded_twice(ledger_target: str) -> None:
    with open_ledger(ledger_target) as ledger:
        ledger.commit([failure("m1", "a.json", "parse")])
        d = Delivery(b"{}", "a.json", "m1", stable_ref=True, redelivered=True)
        again = Entry(d, Kind.REJECTED, Settle.DEAD, "parse")
        ledger.commit([again])
        assert again.recovered
        assert ledger.counts()["failures"] == 1
        ledger.record_replay("a.json")  # replayed: a new death is a new failure
        third = Entry(d, Kind.REJECTED, Settle.DEAD, "parse")
        ledger.commit([third])
        assert not third.recovered
        assert ledger.counts()["failures"] == 2


def test_failures_count_attempts_per_msg_id(ledger_target: str) -> None:
    with open_ledger(ledger_target, source="amqp") as ledger:
        d = Delivery(b"{}", "t1", "m1")
        ledger.commit([Entry(d, Kind.TRANSIENT, Settle.REQUEUE, "http-503", attempt=1)])
        assert ledger.failed_attempts("m1") == 1
        ledger.commit([Entry(d, Kind.TRANSIENT, Settle.DEAD, "http-503", "busy", attempt=2)])
        assert ledger.failed_attempts("m1") == 2
        dead = ledger.dead_letters()
        assert [(r["msg_id"], r["reason"], r["attempt"]) for r in dead] == [("m1", "http-503", 2)]
        assert ledger.last_failure("t1") == ("http-503", "busy")
        assert ledger.last_failure("t2") is None


def test_two_flows_never_refuse_each_others_ids(ledger_target: str) -> None:
    with open_ledger(ledger_target, flow="a") as a, open_ledger(ledger_target, flow="b") as b:
        ea, eb = success("m1", "x.json"), success("m1", "y.json")
        a.commit([ea])
        b.commit([eb])
        assert (ea.kind, eb.kind) == (Kind.SUCCESS, Kind.SUCCESS)
        assert (a.processed_ref("m1"), b.processed_ref("m1")) == ("x.json", "y.json")
        b.commit(
            [Entry(Delivery(b"{}", "z.json", "m1", stable_ref=True), Kind.DUPLICATE, Settle.ACK)]
        )
        fail = Entry(Delivery(b"{}", "f.json", "m2"), Kind.TRANSIENT, Settle.DEAD, "http-503")
        b.commit([fail])
        assert (a.failed_attempts("m2"), b.failed_attempts("m2")) == (0, 1)
        b.record_replay("f.json")  # resets b's attempts of m2
        assert (a.duplicate_ids(), b.duplicate_ids()) == ([], ["m1"])
        assert (a.failed_attempts("m2"), b.failed_attempts("m2")) == (0, 0)
        assert (a.dead_letters(), len(b.dead_letters())) == ([], 1)
        assert (a.last_failure("f.json"), b.last_failure("f.json")) == (None, ("http-503", ""))
        assert a.counts() == {"processed": 1, "duplicates": 0, "failures": 0, "replays": 0}
        assert b.counts() == {"processed": 1, "duplicates": 1, "failures": 1, "replays": 1}
        assert a.counts(all_flows=True) == {
            "processed": 2,
            "duplicates": 1,
            "failures": 1,
            "replays": 1,
        }


def test_flow_names_are_checked(ledger_target: str) -> None:
    for bad in ("", "-a", "a b", "x" * 65, "a'b", "ä"):
        with pytest.raises(UsageError):
            open_ledger(ledger_target, flow=bad)


def test_a_failed_group_commits_nothing(ledger_target: str) -> None:
    with open_ledger(ledger_target) as ledger:
        bad = failure("m2", "b.json", "parse")
        bad.delivery.ref = None  # type: ignore[assignment]  # NOT NULL: the ledger's fault
        with pytest.raises(LedgerError):
            ledger.commit([success("m1", "a.json"), bad])
        assert ledger.counts()["processed"] == 0
        ok = success("m1", "a.json")  # and the ledger still works
        ledger.commit([ok])
        assert ok.kind is Kind.SUCCESS


def test_the_presets_table_commits_with_the_dedup_row(ledger_target: str) -> None:
    with open_ledger(ledger_target, sql=PROCESSED_TABLE) as ledger:
        group = [success(f"m{i}", f"{i}.json", amount=i * 1.5, seq=i) for i in range(5)]
        group.append(success("m1", "again.json"))
        ledger.commit(group)
        assert [e.kind for e in group] == [Kind.SUCCESS] * 5 + [Kind.DUPLICATE]
        rows = ledger.query(
            "SELECT msg_id, order_no, seq, amount, source, ref FROM processed ORDER BY msg_id"
        )[1]
        assert rows == [(f"m{i}", "A", i, i * 1.5, "dirq", f"{i}.json") for i in range(5)]


def test_query_is_read_only(ledger_target: str) -> None:
    with open_ledger(ledger_target) as ledger:
        ledger.commit([success("m1", "a.json")])
        with pytest.raises(LedgerError):
            ledger.query("DELETE FROM messages")
        cols, rows = ledger.query("SELECT count(*) AS n FROM messages")
        assert (cols, rows) == (["n"], [(1,)])
