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

from onceq.effect import Reject, Retry, SqlEffect
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


# --- the SQL effect (inbox pattern) ------------------------------------------------------

INVOICES = "CREATE TABLE IF NOT EXISTS invoices (id TEXT PRIMARY KEY, customer TEXT, total REAL)"


def save(tx: Any, doc: dict[str, Any]) -> None:
    """The invoice example's business write, with a way to fail per message; the
    placeholders are each driver's own (sqlite3: ?, psycopg: %s)."""
    mark = "?" if type(tx).__module__.startswith("sqlite3") else "%s"
    tx.execute(
        f"INSERT INTO invoices (id, customer, total) VALUES ({mark},{mark},{mark})",
        (doc["invoiceId"], doc["customer"], doc["total"]),
    )
    how = doc.get("fail")
    if how == "reject":
        raise Reject("total is negative")
    if how == "retry":
        raise Retry("warehouse busy")
    if how == "bug":
        raise KeyError("oops")
    if how == "commit":
        tx.execute("COMMIT")
    if how == "rollback":
        tx.execute("ROLLBACK")
    if how == "conn-commit":
        tx.commit()


def invoice(inv: str, ref: str | None = None, **doc: Any) -> Entry:
    body = {"invoiceId": inv, "customer": "ACME", "total": 10.0, **doc}
    d = Delivery(body=b"{}", ref=ref or f"{inv}.json", msg_id=inv, stable_ref=True)
    fields = {"group": body["customer"], "seq": None, "kept": {"total": body["total"]}, "doc": body}
    return Entry(d, Kind.SUCCESS, Settle.ACK, fields=fields, max_attempts=2)


@pytest.fixture
def inv_ledger(ledger_target: str) -> Any:
    with open_ledger(ledger_target, flow="inv", sql=SqlEffect(save, setup=INVOICES)) as led:
        yield led


def invoices(ledger: Any) -> list[tuple[Any, ...]]:
    return ledger.query("SELECT id, total FROM invoices ORDER BY id")[1]  # type: ignore[no-any-return]


def test_business_rows_commit_with_the_dedup_row(inv_ledger: Any) -> None:
    group = [invoice("INV-1"), invoice("INV-2", total=7.5)]
    inv_ledger.commit(group)
    assert [e.kind for e in group] == [Kind.SUCCESS, Kind.SUCCESS]
    assert invoices(inv_ledger) == [("INV-1", 10.0), ("INV-2", 7.5)]
    assert inv_ledger.counts()["processed"] == 2


@pytest.mark.parametrize(
    ("how", "kind", "settle", "reason", "detail"),
    [
        ("reject", Kind.REJECTED, Settle.DEAD, "sql-rejected", "total is negative"),
        ("retry", Kind.TRANSIENT, Settle.REQUEUE, "retry", "warehouse busy"),
        ("bug", Kind.TRANSIENT, Settle.REQUEUE, "sql-error", "KeyError: 'oops'"),
    ],
)
def test_a_failing_message_is_undone_alone(
    inv_ledger: Any, how: str, kind: Kind, settle: Settle, reason: str, detail: str
) -> None:
    group = [invoice("INV-1"), invoice("INV-2", fail=how), invoice("INV-3")]
    inv_ledger.commit(group)
    bad = group[1]
    assert (bad.kind, bad.settle, bad.reason, bad.detail) == (kind, settle, reason, detail)
    assert [group[0].kind, group[2].kind] == [Kind.SUCCESS, Kind.SUCCESS]
    # its business row and its dedup row are gone; the others' are there
    assert invoices(inv_ledger) == [("INV-1", 10.0), ("INV-3", 10.0)]
    assert inv_ledger.processed_ref("INV-2") is None
    assert inv_ledger.failed_attempts("INV-2") == 1
    assert inv_ledger.last_failure("INV-2.json") == (reason, detail)


def test_a_retried_message_is_dead_on_its_last_attempt(inv_ledger: Any) -> None:
    inv_ledger.commit([invoice("INV-1", fail="retry")])
    second = invoice("INV-1", fail="retry")
    inv_ledger.commit([second])
    assert (second.attempt, second.settle) == (2, Settle.DEAD)
    ok = invoice("INV-1")
    inv_ledger.commit([ok])
    assert ok.kind is Kind.SUCCESS and invoices(inv_ledger) == [("INV-1", 10.0)]


def test_an_integrity_error_is_a_rejection(inv_ledger: Any) -> None:
    inv_ledger.commit([invoice("INV-1")])
    clash = invoice("INV-1b", invoiceId="INV-1")  # another id, the same business key
    inv_ledger.commit([clash])
    assert (clash.kind, clash.settle, clash.reason) == (Kind.REJECTED, Settle.DEAD, "sql-rejected")
    assert "unique" in clash.detail.lower()
    assert inv_ledger.processed_ref("INV-1b") is None
    assert invoices(inv_ledger) == [("INV-1", 10.0)]


def test_a_duplicate_never_runs_the_function(ledger_target: str) -> None:
    calls: list[str] = []

    def counting(tx: Any, doc: dict[str, Any]) -> None:
        calls.append(doc["invoiceId"])
        save(tx, doc)

    with open_ledger(ledger_target, flow="inv", sql=SqlEffect(counting, setup=INVOICES)) as led:
        group = [invoice("INV-1", "a.json"), invoice("INV-1", "b.json")]
        led.commit(group)
        later = invoice("INV-1", "c.json")
        led.commit([later])
        assert [e.kind for e in (*group, later)] == [Kind.SUCCESS, Kind.DUPLICATE, Kind.DUPLICATE]
        assert calls == ["INV-1"]
        assert led.duplicate_ids() == ["INV-1"]


def test_a_second_copy_shares_the_verdict_of_a_failed_first(inv_ledger: Any) -> None:
    group = [invoice("INV-1", "a.json", fail="retry"), invoice("INV-1", "b.json", fail="retry")]
    inv_ledger.commit(group)
    assert [(e.kind, e.reason) for e in group] == [(Kind.TRANSIENT, "retry")] * 2
    assert inv_ledger.duplicate_ids() == []


@pytest.mark.parametrize("how", ["commit", "rollback", "conn-commit"])
def test_a_function_that_ends_the_transaction_fails_the_group(inv_ledger: Any, how: str) -> None:
    group = [invoice("INV-1"), invoice("INV-2", fail=how)]
    with pytest.raises(LedgerError, match="ended the ledger's transaction"):
        inv_ledger.commit(group)
    # nothing of the group is durable: not INV-1's rows either
    assert invoices(inv_ledger) == []
    assert inv_ledger.counts() == {"processed": 0, "duplicates": 0, "failures": 0, "replays": 0}
    inv_ledger.commit([invoice("INV-1")])  # and the ledger still works
    assert inv_ledger.processed_ref("INV-1") == "INV-1.json"


def test_a_bad_setup_is_one_ledger_error(ledger_target: str) -> None:
    with pytest.raises(LedgerError, match="setup failed"):
        open_ledger(ledger_target, sql=SqlEffect(save, setup="CREATE TABLE ("))
