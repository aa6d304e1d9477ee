"""The SQL effect (inbox pattern): business rows commit with the dedup row, or not at all.

Each test uses a real SQLite ledger file; the function is a plain Python function
writing to an `invoices` table through the transaction the ledger gives it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from onceq._core.effect import Reject, Retry, SqlEffect
from onceq._core.transport import Delivery, Kind, Settle
from onceq._ledger.sqlite import Entry, Ledger
from onceq.errors import LedgerError

SETUP = "CREATE TABLE IF NOT EXISTS invoices (id TEXT PRIMARY KEY, customer TEXT, total REAL)"


def save(tx: Any, doc: dict[str, Any]) -> None:
    """The invoice example's business write, with a way to fail per message."""
    tx.execute(
        "INSERT INTO invoices (id, customer, total) VALUES (?,?,?)",
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
    if how == "conn-commit":
        tx.commit()


def invoice(inv: str, ref: str | None = None, **doc: Any) -> Entry:
    body = {"invoiceId": inv, "customer": "ACME", "total": 10.0, **doc}
    d = Delivery(body=b"{}", ref=ref or f"{inv}.json", msg_id=inv, stable_ref=True)
    fields = {"group": body["customer"], "seq": None, "kept": {"total": body["total"]}, "doc": body}
    return Entry(d, Kind.SUCCESS, Settle.ACK, fields=fields, max_attempts=2)


def rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


@pytest.fixture
def ledger(tmp_path: Path) -> Any:
    with Ledger(tmp_path / "l.db", flow="inv", sql=SqlEffect(save, setup=SETUP)) as led:
        yield led


def test_setup_runs_on_open_and_rows_commit_with_the_dedup_row(ledger: Ledger) -> None:
    group = [invoice("INV-1"), invoice("INV-2", total=7.5)]
    ledger.commit(group)
    assert [e.kind for e in group] == [Kind.SUCCESS, Kind.SUCCESS]
    assert rows(ledger.path, "SELECT id, total FROM invoices ORDER BY id") == [
        ("INV-1", 10.0),
        ("INV-2", 7.5),
    ]
    assert ledger.counts()["processed"] == 2


@pytest.mark.parametrize(
    ("how", "kind", "settle", "reason", "detail"),
    [
        ("reject", Kind.REJECTED, Settle.DEAD, "sql-rejected", "total is negative"),
        ("retry", Kind.TRANSIENT, Settle.REQUEUE, "retry", "warehouse busy"),
        ("bug", Kind.TRANSIENT, Settle.REQUEUE, "sql-error", "KeyError: 'oops'"),
    ],
)
def test_a_failing_message_is_undone_alone(
    ledger: Ledger, how: str, kind: Kind, settle: Settle, reason: str, detail: str
) -> None:
    group = [invoice("INV-1"), invoice("INV-2", fail=how), invoice("INV-3")]
    ledger.commit(group)
    bad = group[1]
    assert (bad.kind, bad.settle, bad.reason, bad.detail) == (kind, settle, reason, detail)
    assert [group[0].kind, group[2].kind] == [Kind.SUCCESS, Kind.SUCCESS]
    # its business row and its dedup row are gone; the others' are there
    assert rows(ledger.path, "SELECT id FROM invoices ORDER BY id") == [("INV-1",), ("INV-3",)]
    assert ledger.processed_ref("INV-2") is None
    assert ledger.failed_attempts("INV-2") == 1
    assert ledger.last_failure("INV-2.json") == (reason, detail)


def test_a_retried_message_is_dead_on_its_last_attempt(ledger: Ledger) -> None:
    ledger.commit([invoice("INV-1", fail="retry")])
    second = invoice("INV-1", fail="retry")
    ledger.commit([second])
    assert (second.attempt, second.settle) == (2, Settle.DEAD)
    ok = invoice("INV-1")  # the partner's warehouse is back: a third copy succeeds
    ledger.commit([ok])
    assert ok.kind is Kind.SUCCESS and rows(ledger.path, "SELECT id FROM invoices") == [("INV-1",)]


def test_an_integrity_error_is_a_rejection(ledger: Ledger) -> None:
    ledger.commit([invoice("INV-1")])
    # another id, but the same business key: the invoices table refuses it
    clash = invoice("INV-1b", invoiceId="INV-1")
    ledger.commit([clash])
    assert (clash.kind, clash.settle, clash.reason) == (Kind.REJECTED, Settle.DEAD, "sql-rejected")
    assert "UNIQUE" in clash.detail
    assert ledger.processed_ref("INV-1b") is None


def test_a_duplicate_never_runs_the_function(tmp_path: Path) -> None:
    calls: list[str] = []

    def counting(tx: Any, doc: dict[str, Any]) -> None:
        calls.append(doc["invoiceId"])
        save(tx, doc)

    with Ledger(tmp_path / "l.db", flow="inv", sql=SqlEffect(counting, setup=SETUP)) as led:
        group = [invoice("INV-1", "a.json"), invoice("INV-1", "b.json")]  # two copies, one group
        led.commit(group)
        later = invoice("INV-1", "c.json")  # a copy in a later group
        led.commit([later])
        assert [e.kind for e in (*group, later)] == [Kind.SUCCESS, Kind.DUPLICATE, Kind.DUPLICATE]
        assert calls == ["INV-1"]
        assert led.duplicate_ids() == ["INV-1"]


def test_a_second_copy_shares_the_verdict_of_a_failed_first(ledger: Ledger) -> None:
    """Its twin's effect was undone: the second copy is not acked as done either."""
    group = [invoice("INV-1", "a.json", fail="retry"), invoice("INV-1", "b.json", fail="retry")]
    ledger.commit(group)
    assert [(e.kind, e.reason) for e in group] == [(Kind.TRANSIENT, "retry")] * 2
    assert ledger.duplicate_ids() == []


@pytest.mark.parametrize("how", ["commit", "conn-commit"])
def test_a_function_that_ends_the_transaction_fails_the_group(ledger: Ledger, how: str) -> None:
    group = [invoice("INV-1"), invoice("INV-2", fail=how)]
    with pytest.raises(LedgerError, match="ended the ledger's transaction"):
        ledger.commit(group)
    # nothing of the group is durable: not INV-1's rows either
    assert rows(ledger.path, "SELECT count(*) FROM invoices") == [(0,)]
    assert ledger.counts() == {"processed": 0, "duplicates": 0, "failures": 0, "replays": 0}
    ledger.commit([invoice("INV-1")])  # and the ledger still works
    assert ledger.processed_ref("INV-1") == "INV-1.json"


def test_a_database_fault_in_the_function_fails_the_group(tmp_path: Path) -> None:
    def readonly(tx: Any, doc: dict[str, Any]) -> None:
        err = sqlite3.OperationalError("attempt to write a readonly database")
        err.sqlite_errorcode = sqlite3.SQLITE_READONLY  # type: ignore[attr-defined]
        raise err

    with Ledger(tmp_path / "l.db", sql=SqlEffect(readonly)) as led:
        with pytest.raises(LedgerError):
            led.commit([invoice("INV-1")])
        assert led.counts()["processed"] == 0


def test_a_bad_setup_is_one_ledger_error(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="setup failed"):
        Ledger(tmp_path / "l.db", sql=SqlEffect(save, setup="CREATE TABLE ("))


def test_a_sql_function_flow_through_the_loop(tmp_path: Path) -> None:
    """The loop with no call effect (no_effect): the primary key in the commit decides."""
    import asyncio
    import json

    from onceq._core.consumer import Consumer, Outcome
    from onceq._sources.memory import MemoryTransport

    def decode(d: Delivery) -> Outcome:
        doc = json.loads(d.body)
        d.msg_id = doc["invoiceId"]
        return Outcome(Kind.SUCCESS, fields={"group": doc["customer"], "kept": {}, "doc": doc})

    t = MemoryTransport()
    for inv, total in [("INV-1", 1), ("INV-2", -1), ("INV-1", 1), ("INV-3", 3)]:
        t.publish(json.dumps({"invoiceId": inv, "customer": "ACME", "total": total}).encode())

    def checked(tx: Any, doc: dict[str, Any]) -> None:
        if doc["total"] < 0:
            raise Reject("negative total")
        save(tx, doc)

    with Ledger(tmp_path / "l.db", flow="inv", sql=SqlEffect(checked, setup=SETUP)) as led:
        stats = asyncio.run(Consumer(t, led, decode).run())
    assert (stats.processed, stats.duplicates, stats.dead) == (2, 1, 1)
    assert stats.reasons == {"sql-rejected": 1}
    assert rows(tmp_path / "l.db", "SELECT id FROM invoices ORDER BY id") == [
        ("INV-1",),
        ("INV-3",),
    ]
