"""The ledger: the primary key decides, groups commit atomically, settings hold."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from onceq.errors import LedgerError, NotFound
from onceq.ledger import Entry, Ledger
from onceq.transport import Delivery, Kind, Settle


def success(msg_id: str, ref: str, stable: bool = True, **fields: object) -> Entry:
    d = Delivery(body=b"{}", ref=ref, msg_id=msg_id, stable_ref=stable)
    return Entry(d, Kind.SUCCESS, Settle.ACK, fields={"order_no": "A", "seq": 1, **fields})


def test_settings_that_the_guarantees_depend_on(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        conn = ledger._write
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 60_000


def test_seed_schema_msg_id_primary_key_and_columns(tmp_path: Path) -> None:
    Ledger(tmp_path / "l.db").close()
    conn = sqlite3.connect(tmp_path / "l.db")
    cols = {r[1]: r for r in conn.execute("PRAGMA table_info(processed)")}
    assert {"msg_id", "order_no", "seq", "amount", "processed_at"} <= set(cols)
    assert cols["msg_id"][5] == 1  # pk
    with pytest.raises(sqlite3.IntegrityError):
        conn.executemany(
            "INSERT INTO processed (msg_id, processed_at) VALUES (?, 'now')", [("x",), ("x",)]
        )


def test_second_copy_in_one_group_becomes_a_duplicate(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        a, b = success("m1", "a.json"), success("m1", "b.json")
        ledger.commit([a, b])
        assert (a.kind, b.kind) == (Kind.SUCCESS, Kind.DUPLICATE)
        assert b.settle is Settle.ACK
        assert ledger.counts()["processed"] == 1
        assert ledger.processed_ref("m1") == "a.json"


def test_duplicates_are_recorded_once_per_copy(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        ledger.commit([success("m1", "a.json")])
        for _ in range(2):  # the same copy seen twice (a crash before its move)
            d = Delivery(b"{}", "b.json", "m1", stable_ref=True)
            ledger.commit([Entry(d, Kind.DUPLICATE, Settle.ACK)])
        assert ledger.duplicate_ids() == ["m1"]
        assert ledger.counts()["duplicates"] == 1


def test_a_copy_whose_row_names_it_is_recovered_not_duplicate(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        ledger.commit([success("m1", "a.json")])
        e = Entry(Delivery(b"{}", "a.json", "m1", stable_ref=True), Kind.DUPLICATE, Settle.ACK)
        ledger.commit([e])
        assert e.recovered
        assert ledger.duplicate_ids() == []


def test_unstable_refs_never_count_as_recovered(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db", source="amqp") as ledger:
        ledger.commit([success("m1", "tag-1", stable=False)])
        e = Entry(Delivery(b"{}", "tag-1", "m1"), Kind.DUPLICATE, Settle.ACK)
        ledger.commit([e])
        assert not e.recovered
        assert ledger.duplicate_ids() == ["m1"]


def test_a_refused_business_write_rejects_that_message_alone(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with Ledger(path) as ledger:
        ledger._write.execute(
            "CREATE TRIGGER no_neg BEFORE INSERT ON processed WHEN NEW.amount < 0"
            " BEGIN SELECT RAISE(ABORT, 'negative amount'); END"
        )
        good, bad = success("m1", "a.json", amount=5), success("m2", "b.json", amount=-1)
        ledger.commit([good, bad])
        assert good.kind is Kind.SUCCESS
        assert (bad.kind, bad.settle, bad.reason) == (Kind.REJECTED, Settle.DEAD, "ledger-refused")
        assert "negative amount" in bad.detail
        assert ledger.processed_ref("m1") == "a.json"
        assert ledger.processed_ref("m2") is None
        assert [r["ref"] for r in ledger.dead_letters()] == ["b.json"]


def test_failures_count_attempts_per_msg_id(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db", source="amqp") as ledger:
        d = Delivery(b"{}", "t1", "m1")
        ledger.commit([Entry(d, Kind.TRANSIENT, Settle.REQUEUE, "http-503", attempt=1)])
        assert ledger.failed_attempts("m1") == 1
        ledger.commit([Entry(d, Kind.TRANSIENT, Settle.DEAD, "http-503", attempt=2)])
        assert ledger.failed_attempts("m1") == 2
        dead = ledger.dead_letters()
        assert [(r["msg_id"], r["reason"], r["attempt"]) for r in dead] == [("m1", "http-503", 2)]
        assert ledger.last_failure("t1") == ("http-503", "")


def test_a_failed_group_commits_nothing(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        bad = success("m2", "b.json")
        bad.kind = Kind.REJECTED
        bad.delivery.ref = None  # type: ignore[assignment]  # NOT NULL violation outside a savepoint
        with pytest.raises(LedgerError):
            ledger.commit([success("m1", "a.json"), bad])
        assert ledger.counts()["processed"] == 0


def test_query_is_read_only(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        with pytest.raises(LedgerError):
            ledger.query("DELETE FROM processed")
        cols, rows = ledger.query("SELECT count(*) AS n FROM processed")
        assert (cols, rows) == (["n"], [(0,)])


def test_opening_a_missing_ledger_without_create_changes_nothing(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        Ledger(tmp_path / "none.db", create=False)
    assert not (tmp_path / "none.db").exists()


def test_two_writers_queue_instead_of_failing_locked(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    Ledger(path).close()
    errors: list[BaseException] = []

    def writer(prefix: str) -> None:
        try:
            with Ledger(path) as ledger:
                for i in range(200):
                    ledger.commit([success(f"{prefix}{i}", f"{prefix}{i}.json")])
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(p,)) for p in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with Ledger(path) as ledger:
        assert ledger.counts()["processed"] == 400


def test_query_cannot_attach_another_file(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger, pytest.raises(LedgerError):
        ledger.query(f"ATTACH DATABASE '{tmp_path / 'other.db'}' AS o")
    assert not (tmp_path / "other.db").exists()
