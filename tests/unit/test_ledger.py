"""The ledger: the primary key decides, groups commit atomically, settings hold."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import onceq._ledger.sqlite as ledger_module
from onceq._core.transport import Delivery, Kind, Settle
from onceq._exercise.processed_table import PROCESSED_TABLE
from onceq._ledger.rows import chunks
from onceq._ledger.schema import VERSION
from onceq._ledger.sqlite import Entry, Ledger, encode_kept
from onceq._sources.dirq.order import DEFAULT_SQL, run_check
from onceq.errors import LedgerError, NotFound, UsageError

V010_PROCESSED = """CREATE TABLE processed (
    msg_id       TEXT PRIMARY KEY,
    order_no     TEXT,              -- the business key: an order number, a claimId
    seq          INTEGER,           -- the sender's sequence number within order_no
    amount       REAL,
    processed_at TEXT NOT NULL,     -- UTC, ISO 8601
    source       TEXT NOT NULL DEFAULT 'dirq',
    ref          TEXT               -- the file name / delivery that took effect
)"""


def success(msg_id: str, ref: str, stable: bool = True, **fields: object) -> Entry:
    d = Delivery(body=b"{}", ref=ref, msg_id=msg_id, stable_ref=stable)
    kept = {"amount": fields.pop("amount")} if "amount" in fields else {}
    return Entry(
        d, Kind.SUCCESS, Settle.ACK, fields={"group": "A", "seq": 1, "kept": kept, **fields}
    )


def test_settings_that_the_guarantees_depend_on(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        conn = ledger._write
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 60_000


def test_seed_schema_msg_id_primary_key_and_columns(tmp_path: Path) -> None:
    """The presets' business table is the exercise's `processed`, 0.1.0's DDL word for word."""
    Ledger(tmp_path / "l.db", sql=PROCESSED_TABLE).close()
    conn = sqlite3.connect(tmp_path / "l.db")
    (ddl,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'processed'").fetchone()
    assert ddl == V010_PROCESSED
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
        d = Delivery(b"{}", "a.json", "m1", stable_ref=True, redelivered=True)
        e = Entry(d, Kind.DUPLICATE, Settle.ACK)
        ledger.commit([e])
        assert e.recovered
        assert ledger.duplicate_ids() == []


def test_a_new_copy_that_only_shares_the_name_is_a_duplicate(tmp_path: Path) -> None:
    """A file re-sent under the same name was never claimed before: not recovered."""
    with Ledger(tmp_path / "l.db") as ledger:
        ledger.commit([success("m1", "a.json")])
        e = Entry(Delivery(b"{}", "a.json", "m1", stable_ref=True), Kind.DUPLICATE, Settle.ACK)
        ledger.commit([e])
        assert not e.recovered
        assert ledger.duplicate_ids() == ["m1"]


def test_unstable_refs_never_count_as_recovered(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db", source="amqp") as ledger:
        ledger.commit([success("m1", "tag-1", stable=False)])
        e = Entry(Delivery(b"{}", "tag-1", "m1"), Kind.DUPLICATE, Settle.ACK)
        ledger.commit([e])
        assert not e.recovered
        assert ledger.duplicate_ids() == ["m1"]


def test_a_refused_business_write_rejects_that_message_alone(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with Ledger(path, sql=PROCESSED_TABLE) as ledger:
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
        rows = ledger.query("SELECT msg_id, order_no, seq, amount, source, ref FROM processed")[1]
        assert rows == [("m1", "A", 1, 5.0, "dirq", "a.json")]


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
            ledger.query("DELETE FROM messages")
        cols, rows = ledger.query("SELECT count(*) AS n FROM messages")
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


# --- schema 2: per flow, kept JSON, the presets' bulk table ------------------------------


def test_two_flows_in_one_file_never_refuse_each_others_ids(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with Ledger(path, flow="a") as a, Ledger(path, flow="b") as b:
        ea, eb = success("m1", "x.json"), success("m1", "y.json")
        a.commit([ea])
        b.commit([eb])
        assert (ea.kind, eb.kind) == (Kind.SUCCESS, Kind.SUCCESS)
        assert (a.processed_ref("m1"), b.processed_ref("m1")) == ("x.json", "y.json")
        # every read is the flow's own
        b.commit(
            [Entry(Delivery(b"{}", "z.json", "m1", stable_ref=True), Kind.DUPLICATE, Settle.ACK)]
        )
        fail = Entry(Delivery(b"{}", "f.json", "m2"), Kind.TRANSIENT, Settle.DEAD, "http-503")
        b.commit([fail])
        assert (a.failed_attempts("m2"), b.failed_attempts("m2")) == (0, 1)
        b.record_replay("f.json")  # resets b's attempts of m2 (schema 3)
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


def test_flow_names_are_checked(tmp_path: Path) -> None:
    for bad in ("", "-a", "a b", "x" * 65, "a'b", "ä"):
        with pytest.raises(UsageError):
            Ledger(tmp_path / "l.db", flow=bad)
    Ledger(tmp_path / "l.db", flow="inv_2.x-y").close()


def test_kept_is_json_queryable_and_partner_duplicates_are_marked(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db", flow="invoices") as ledger:
        e = success("INV-1", "a", kept={"total": 120.5, "customer": "ÄCME"}, group="ACME")
        d = success("INV-2", "b", kept={"total": 7}, partner_duplicate=True)
        ledger.commit([e, d])
        rows = ledger.query(
            "SELECT msg_id, grp, json_extract(kept, '$.total'), kept, partner_duplicate"
            " FROM messages WHERE flow = 'invoices' ORDER BY msg_id"
        )[1]
    assert rows == [
        ("INV-1", "ACME", 120.5, '{"total":120.5,"customer":"ÄCME"}', 0),
        ("INV-2", "A", 7, '{"total":7}', 1),
    ]


def test_the_doc_is_never_stored(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        ledger.commit([success("m1", "a", doc={"secret": "s3cr3t"})])
    files = [p.read_bytes() for p in tmp_path.iterdir()]  # closed: the WAL is checkpointed
    assert files and not any(b"s3cr3t" in f for f in files)


def test_a_newer_schema_is_refused_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    Ledger(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {VERSION + 1}")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(LedgerError, match="written by a newer onceq"):
        Ledger(path)
    assert path.read_bytes() == before


def test_the_preset_table_costs_a_few_statements_per_group(tmp_path: Path) -> None:
    """Multi-row INSERTs for messages and processed, in power-of-two chunks: a group of
    300 is 256+32+8+4 rows per table, not 300 statements."""
    with Ledger(tmp_path / "l.db", sql=PROCESSED_TABLE) as ledger:
        seen: list[str] = []
        ledger._write.set_trace_callback(seen.append)
        ledger.commit([success(f"m{i}", f"{i}.json", amount=i) for i in range(300)])
        ledger._write.set_trace_callback(None)
        inserts = [s for s in seen if s.lstrip().upper().startswith("INSERT")]
        tables = [s.split("(")[0].split()[-1] for s in inserts]
        assert tables == ["messages"] * 4 + ["processed"] * 4
        rows = [s.count("),(") + 1 for s in inserts]  # the trace has the values bound
        assert rows == [256, 32, 8, 4] * 2
        assert ledger.query("SELECT count(*), sum(amount) FROM processed")[1] == [(300, 44850.0)]


def test_groups_of_any_size_reuse_a_few_statement_texts() -> None:
    """A multi-row INSERT whose text the connection has not seen is parsed and planned
    again (for 256 rows, about as costly as inserting them). Groups come in every size
    (and the processed insert is a group minus its duplicates), so the chunks of any
    size are powers of two: at most 9 texts per table, each prepared once per run."""
    sizes = set()
    for n in range(0, 1100):
        got = [len(c) for c in chunks(list(range(n)))]
        assert sum(got) == n and got == sorted(got, reverse=True)
        sizes.update(got)
    assert sizes == {1, 2, 4, 8, 16, 32, 64, 128, 256}


def test_order_check_reads_the_flows_own_group_and_seq(tmp_path: Path) -> None:
    """flow_sql over messages finds what the exercise's query finds over processed."""
    rows = [("m1", "A", 1), ("m2", "A", 2), ("m3", "A", 2), ("m4", "A", 5), ("m5", "B", None)]
    path = tmp_path / "l.db"
    with Ledger(path, sql=PROCESSED_TABLE) as orders, Ledger(path, flow="other") as other:
        orders.commit([success(m, f"{m}.json", group=g, seq=s) for m, g, s in rows])
        other.commit([success("x1", "x", group="A", seq=9)])  # another flow: not checked
        exercise = orders.query(DEFAULT_SQL)
        assert run_check(orders) == exercise
        assert exercise[1][0] == ("A", "repeated", 2, 2, 2, "m2 m3")
        cols, found = run_check(other, group_label="customer")
        assert cols[0] == "customer" and found == [("A", "gap", 1, 8, 8, "")]


_kept_values = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6)
    | st.sampled_from(["é", '\x00\n"\\', "\u2028", "x\ud800"])
    | st.lists(st.integers(), max_size=2)
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.text(max_size=4) | st.integers(), _kept_values, max_size=4))
def test_the_fast_kept_encoding_is_the_encoders(kept: dict[object, object]) -> None:
    """encode_kept (flat dicts by hand, for speed) writes exactly what the encoder
    writes, and refuses exactly what it refuses (NaN, Infinity)."""
    try:
        want: str | type[Exception] = ledger_module._encode_kept(kept)
    except ValueError:
        want = ValueError
    try:
        got: str | type[Exception] = encode_kept(kept)  # type: ignore[arg-type]
    except ValueError:
        got = ValueError
    assert got == want


def test_a_source_with_a_quote_is_stored_as_it_is(tmp_path: Path) -> None:
    """The group's flow and source are bound once per multi-row INSERT (to bind 6
    values a row, not 9), never pasted into its text."""
    with Ledger(tmp_path / "l.db", "it's'; --", sql=PROCESSED_TABLE) as ledger:
        ledger.commit([success(f"m{i}", f"{i}.json", amount=i) for i in range(3)])
        assert ledger.query("SELECT DISTINCT source FROM messages")[1] == [("it's'; --",)]
        assert ledger.query("SELECT DISTINCT source FROM processed")[1] == [("it's'; --",)]
        assert ledger.counts()["processed"] == 3
