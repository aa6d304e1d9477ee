"""Ledger schema 3: a schema-2 ledger migrated in place, attempts reset by a replay, the
failure detail cap, delay_s, and the dead-letter operations' audit (onceq._ledger.ops)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cli_support import invoke
from ledger_support import dump, old_ledger, q
from onceq._core.consumer import Consumer, Outcome
from onceq._core.retry import RetryPolicy
from onceq._core.transport import Delivery, Kind, Settle
from onceq._ledger.rows import DETAIL_CAP
from onceq._ledger.schema import VERSION
from onceq._ledger.sqlite import Entry, Ledger
from onceq._sources.memory import MemoryTransport
from onceq.errors import LedgerError
from support import open_db

T = "2026-03-01T00:00:0{}.000000+00:00"
V2_MESSAGES = [("default", "m-1", "A", 1, '{"amount":1}', 0, T.format(1), "dirq", "a.json")]
V2_DUPLICATES = [("default", "m-1", "a2.json", T.format(2))]
# m-5 died on its second try, was replayed (by file name), then failed once more;
# m-6 (flow 'other') died and was never replayed.
V2_FAILURES = [
    (1, "default", "m-5", "e.json", "dirq", "http-503", "", 1, "requeue", T.format(1)),
    (2, "default", "m-5", "e.json", "dirq", "http-503", "", 2, "dead", T.format(2)),
    (4, "default", "m-5", "e.json", "dirq", "http-503", "", 3, "requeue", T.format(4)),
    (5, "other", "m-6", "f.json", "amqp", "http-422", "no", 1, "dead", T.format(5)),
]
V2_REPLAYS = [(3, "default", "e.json", T.format(3))]


def make_v2_ledger(path: Path) -> Path:
    rows = {
        "messages": V2_MESSAGES,
        "duplicates": V2_DUPLICATES,
        "failures": V2_FAILURES,
        "replays": V2_REPLAYS,
    }
    return old_ledger(path, 2, rows)


def failure(msg_id: str, ref: str, settle: Settle, reason: str = "http-503", **kw: Any) -> Entry:
    kind = Kind.REJECTED if reason == "http-422" else Kind.TRANSIENT
    return Entry(Delivery(b"{}", ref, msg_id), kind, settle, reason, **kw)


# --- migration -------------------------------------------------------------------------


def test_a_schema_2_ledger_is_migrated_with_its_rows(tmp_path: Path) -> None:
    path = make_v2_ledger(tmp_path / "ledger.db")
    with Ledger(path) as ledger:
        assert not ledger.created
        assert ledger.processed_ref("m-1") == "a.json"
        # the old replay names its file only: the migration found m-5 by it, and only
        # the failure after the replay counts (a replay before the upgrade resets too)
        assert ledger.failed_attempts("m-5") == 1
    assert q(path, "PRAGMA user_version") == [(VERSION,)]
    assert q(path, "SELECT * FROM messages") == V2_MESSAGES
    assert q(path, "SELECT * FROM duplicates") == V2_DUPLICATES
    assert q(path, "SELECT * FROM failures ORDER BY id") == [(*r, None) for r in V2_FAILURES]
    assert q(path, "SELECT id, flow, ref, at, msg_id, op, reset_after FROM replays") == [
        (3, "default", "e.json", T.format(3), "m-5", None, 2)
    ]
    assert q(path, "SELECT count(*) FROM dead_ops") == [(0,)]
    assert q(path, "SELECT name FROM sqlite_master WHERE name = 'replays_msg'") == [
        ("replays_msg",)
    ]
    with Ledger(path, flow="other") as other:
        assert other.failed_attempts("m-6") == 1
    before = dump(path)
    Ledger(path).close()
    assert dump(path) == before  # a second open changes nothing


def test_a_schema_2_migration_that_fails_midway_leaves_the_ledger_as_it_was(
    tmp_path: Path,
) -> None:
    path = make_v2_ledger(tmp_path / "ledger.db")
    # A broken rule: a trigger writing to a table since dropped fires on the migration's
    # last step (replays get their msg_id), after every column was added.
    with open_db(path) as conn:
        conn.execute("CREATE TABLE audit (n INTEGER)")
        conn.execute(
            "CREATE TRIGGER t AFTER UPDATE ON replays BEGIN INSERT INTO audit VALUES (1); END"
        )
        conn.execute("DROP TABLE audit")
    before = dump(path)
    with pytest.raises(LedgerError, match=r"cannot migrate a schema-2 ledger .* left as it was"):
        Ledger(path)
    assert dump(path) == before
    r = invoke("dirq", "order-check", "--db", str(path))
    assert r.returncode == 8 and len(r.stderr.splitlines()) == 1, r.stderr
    assert dump(path) == before


def test_order_check_without_a_ledger_named_says_so_in_one_line(tmp_path: Path) -> None:
    r = invoke("dirq", "order-check", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr == "onceq: name the ledger: --db PATH, or QDIR for QDIR/ledger.db\n"
    assert list(tmp_path.iterdir()) == []  # nothing made


def test_a_damaged_schema_2_ledger_is_refused_unchanged(tmp_path: Path) -> None:
    path = make_v2_ledger(tmp_path / "ledger.db")
    with open_db(path) as conn:
        conn.execute("DROP TABLE duplicates")
    before = dump(path)
    with pytest.raises(LedgerError, match=r"damaged ledger \(schema 2, missing table duplicates"):
        Ledger(path)
    assert dump(path) == before


def test_a_new_ledger_is_schema_3(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    Ledger(path).close()
    assert q(path, "PRAGMA user_version") == [(VERSION,)]
    cols = {r[1] for r in q(path, "PRAGMA table_info(replays)")}
    assert {"msg_id", "op", "reset_after"} <= cols


# --- attempts and replays --------------------------------------------------------------


def test_a_replay_resets_the_attempts_of_its_message_only(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        ledger.commit([failure("m1", "r1", Settle.REQUEUE), failure("m2", "r2", Settle.DEAD)])
        ledger.commit([failure("m1", "r1", Settle.DEAD)])
        assert (ledger.failed_attempts("m1"), ledger.failed_attempts("m2")) == (2, 1)
        ledger.record_replay("r1")  # by file name: the newest failure of r1 names m1
        assert (ledger.failed_attempts("m1"), ledger.failed_attempts("m2")) == (0, 1)
        ledger.commit([failure("m1", "r1b", Settle.REQUEUE)])
        assert ledger.failed_attempts("m1") == 1  # counting starts again after the replay
        with ledger._transaction() as conn:
            assert ledger.failures_in(conn, "m1") == 1
        # a replay that names the msg_id resets it whatever the ref
        ledger.record_replay("elsewhere", "m1")
        assert ledger.failed_attempts("m1") == 0
        # the dead letters stay on record: a replay changes no failure row
        assert [r["msg_id"] for r in ledger.dead_letters()] == ["m2", "m1"]


def test_a_replayed_message_gets_its_retries_again_in_the_loop(tmp_path: Path) -> None:
    """Through the consume loop: dead after the exercise's 2 tries; replayed, it is tried
    twice again (without the reset its old attempts would kill it after one)."""
    calls: list[str] = []

    def decode(d: Delivery) -> Outcome:
        d.msg_id = json.loads(d.body)["id"]
        return Outcome(Kind.SUCCESS, fields={})

    async def partner(d: Delivery, fields: dict[str, Any]) -> Outcome:
        calls.append(d.msg_id or "")
        return Outcome(Kind.TRANSIENT, "http-503")

    async def consume(ledger: Ledger) -> MemoryTransport:
        t = MemoryTransport()
        t.publish(b'{"id": "b1"}', ref="b1.json")
        await Consumer(t, ledger, decode, partner, retry=RetryPolicy.exercise()).run()
        return t

    with Ledger(tmp_path / "l.db") as ledger:
        t = asyncio.run(consume(ledger))
        assert len(calls) == 2 and len(t.dead) == 1
        ledger.record_replay("b1.json", "b1")
        t = asyncio.run(consume(ledger))
        assert len(calls) == 4 and len(t.dead) == 1 and len(t.requeued) == 1
        assert [r["attempt"] for r in ledger.dead_letters()] == [2, 2]


# --- failure rows ----------------------------------------------------------------------


def test_a_megabyte_of_detail_is_stored_as_at_most_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    huge = "x" * 1_000_000
    with Ledger(path) as ledger:
        ledger.commit([failure("m1", "r1", Settle.DEAD, detail=huge)])
        # a lone surrogate at the cut is made safe and still fits
        ledger.commit([failure("m2", "r2", Settle.DEAD, detail="y" * 499 + "\udcff" * 10)])
    assert DETAIL_CAP == 500
    rows = q(path, "SELECT msg_id, length(detail) FROM failures ORDER BY id")
    assert rows == [("m1", 500), ("m2", 500)]
    assert path.stat().st_size < 200_000  # the megabyte is nowhere in the file


def test_a_delayed_failure_records_its_delay(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with Ledger(path) as ledger:
        delayed = failure("m1", "r1", Settle.DELAY)
        delayed.delivery.delay = 30.0
        requeued = failure("m2", "r2", Settle.REQUEUE)
        requeued.delivery.delay = 7.0  # stale: only a DELAY's delay is recorded
        ledger.commit([delayed, requeued, failure("m3", "r3", Settle.DEAD)])
    assert q(path, "SELECT msg_id, action, delay_s FROM failures ORDER BY id") == [
        ("m1", "delay", 30.0),
        ("m2", "requeue", None),
        ("m3", "dead", None),
    ]


# --- dead letters ----------------------------------------------------------------------


def test_dead_letters_filter_by_reason_and_time(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with Ledger(path) as ledger:
        ledger.commit([failure("m1", "r1", Settle.DEAD, "http-422")])
        ledger.commit([failure("m2", "r2", Settle.DEAD), failure("m3", "r3", Settle.REQUEUE)])
        with open_db(path) as conn:  # m1 died a day ago
            conn.execute("UPDATE failures SET at = '2000-01-01T00:00:00+00:00' WHERE msg_id='m1'")
        assert [r["msg_id"] for r in ledger.dead_letters()] == ["m1", "m2"]
        assert [r["msg_id"] for r in ledger.dead_letters(reason="http-422")] == ["m1"]
        assert ledger.dead_letters(reason="http-4") == []  # exact, not a prefix
        hour_ago = datetime.now(UTC) - timedelta(hours=1)
        assert [r["msg_id"] for r in ledger.dead_letters(since=hour_ago)] == ["m2"]
        naive = hour_ago.replace(tzinfo=None)  # a naive time is UTC
        assert [r["msg_id"] for r in ledger.dead_letters(since=naive)] == ["m2"]
        assert [r["msg_id"] for r in ledger.dead_letters(since="1999-12-31")] == ["m1", "m2"]
        assert ledger.dead_letters(reason="http-503", since=hour_ago)[0]["msg_id"] == "m2"


def test_dead_info_is_the_newest_death_and_the_attempts_since_the_last_replay(
    tmp_path: Path,
) -> None:
    with Ledger(tmp_path / "l.db") as ledger, Ledger(tmp_path / "l.db", flow="x") as other:
        ledger.commit([failure("m1", "r1", Settle.REQUEUE, detail="first")])
        ledger.commit([failure("m1", "r1", Settle.DEAD, detail="second")])
        ledger.record_replay("r1", "m1")
        ledger.commit([failure("m1", "r1", Settle.DEAD, "http-422", detail="third")])
        ledger.commit([failure("m2", "r2", Settle.REQUEUE)])  # not dead
        other.commit([failure("m3", "r3", Settle.DEAD)])  # another flow's
        many = [f"n{i}" for i in range(1200)]  # more than one IN (…) list
        ledger.commit([failure(m, m, Settle.DEAD) for m in many])
        info = ledger.dead_info(["m1", "m2", "m3", "nope", *many])
    assert set(info) == {"m1", *many}
    assert info["m1"]["reason"] == "http-422" and info["m1"]["detail"] == "third"
    assert info["m1"]["attempts"] == 1 and info["m1"]["at"]
    assert all(info[m]["attempts"] == 1 for m in many)


# --- the dead-letter operations' audit -------------------------------------------------


def test_a_replay_operation_is_audited_with_its_count(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with Ledger(path) as ledger:
        ledger.commit([failure(m, f"{m}.json", Settle.DEAD) for m in ("a", "b", "c")])
        op = ledger.start_op("amqp", "replay", {"reason": "http-503", "limit": None}, "claim.dead")
        running = ledger.dead_ops()[0]
        assert running["finished_at"] is None and running["count"] == 0
        ledger.record_replays(op, [("tag-1", "a"), ("tag-2", "b")])
        ledger.record_replays(op, [("c.json", None)])  # msg_id from its file's failure
        ledger.finish_op(op)
        assert [ledger.failed_attempts(m) for m in "abc"] == [0, 0, 0]
        (row,) = ledger.dead_ops()
    assert row["id"] == op and row["flow"] == "default"
    assert (row["transport"], row["op"], row["queue"]) == ("amqp", "replay", "claim.dead")
    assert row["filter"] == {"reason": "http-503", "limit": None}
    assert row["count"] == 3 and row["ids"] == [] and row["finished_at"] >= row["started_at"]
    assert q(path, "SELECT ref, msg_id, op, reset_after FROM replays ORDER BY id") == [
        ("tag-1", "a", op, 1),
        ("tag-2", "b", op, 2),
        ("c.json", "c", op, 3),
    ]


def test_a_purge_is_audited_with_the_ids_it_removed(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        op = ledger.start_op("dirq", "purge", {"all": True}, "/q/error")
        ledger.record_purged(op, ["a.json", "b.json"])
        ledger.record_purged(op, ["bad-\udcff.json"])  # a name that is not UTF-8
        # killed here: finished_at stays NULL, what it did is on record
        (row,) = ledger.dead_ops()
    assert row["count"] == 3 and row["finished_at"] is None
    assert row["ids"] == ["a.json", "b.json", "bad-\udcff.json"]


def test_dead_ops_are_per_flow_newest_first_and_limited(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger, Ledger(tmp_path / "l.db", flow="x") as other:
        ids = [ledger.start_op("amqp", "purge", {"n": i}, "q") for i in range(5)]
        other.start_op("dirq", "replay", {}, "q2")
        assert [r["id"] for r in ledger.dead_ops()] == ids[::-1]
        assert [r["filter"]["n"] for r in ledger.dead_ops(limit=2)] == [4, 3]
        assert [r["transport"] for r in other.dead_ops()] == ["dirq"]


def test_an_unknown_operation_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with Ledger(path) as ledger, Ledger(path, flow="x") as other:
        ledger.commit([failure("a", "a.json", Settle.DEAD)])
        op = other.start_op("amqp", "replay", {}, "q")
        with pytest.raises(LedgerError, match="no dead-letter operation"):
            ledger.record_replays(op, [("a.json", "a")])  # another flow's operation
        with pytest.raises(LedgerError, match="no dead-letter operation"):
            ledger.record_purged(999, ["a"])
        assert ledger.failed_attempts("a") == 1  # the replay row was rolled back with it
        assert ledger.counts()["replays"] == 0
        with pytest.raises(ValueError, match="transport"):
            ledger.start_op("Kafka!", "replay", {}, "q")  # not a source's tag
        with pytest.raises(ValueError, match="op"):
            ledger.start_op("amqp", "delete", {}, "q")
        assert ledger.dead_ops() == []
