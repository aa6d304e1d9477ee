"""The ledger side of `onceq status`: counts per flow, dead letters net of replays,
the consumers' rows (stale decided by their own period), on both kinds of ledger."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from onceq._core.transport import Delivery, Kind, Settle
from onceq._ledger.sqlite import Entry
from onceq._ledger.target import open_ledger
from onceq._ops.status_ledger import LedgerView
from onceq.errors import LedgerUnavailable


def entry(msg_id: str, kind: Kind, settle: Settle, reason: str = "") -> Entry:
    return Entry(Delivery(b"{}", f"{msg_id}.json", msg_id, stable_ref=True), kind, settle, reason)


def test_counts_dead_letters_by_reason_net_of_replays(ledger_target: str) -> None:
    a = open_ledger(ledger_target, flow="a")
    b = open_ledger(ledger_target, flow="b")
    try:
        a.commit([entry(f"m{i}", Kind.SUCCESS, Settle.ACK) for i in range(3)])
        a.commit([entry("m0", Kind.DUPLICATE, Settle.ACK)])
        a.commit([entry("d1", Kind.REJECTED, Settle.DEAD, "http-422")])
        a.commit([entry("d2", Kind.REJECTED, Settle.DEAD, "http-422")])
        a.commit([entry("d3", Kind.REJECTED, Settle.DEAD, "parse")])
        b.commit([entry("x", Kind.REJECTED, Settle.DEAD, "http-503")])
        # d2 replayed, then it succeeds: no longer a dead letter. d3 replayed and dead
        # again: one dead letter, not two.
        a.record_replay("d2.json", "d2")
        a.commit([entry("d2", Kind.SUCCESS, Settle.ACK)])
        a.record_replay("d3.json", "d3")
        a.commit([entry("d3", Kind.REJECTED, Settle.DEAD, "parse")])
    finally:
        a.close()
        b.close()
    view = LedgerView(ledger_target).read()
    assert view.exists and view.flows == ["a", "b"]
    assert view.flow_counts("a") == {
        "processed": 4,
        "duplicates": 1,
        "dead": 2,
        "dead_by_reason": {"http-422": 1, "parse": 1},
        "failures": 4,
        "retried": 0,
    }
    assert view.flow_counts("b")["dead_by_reason"] == {"http-503": 1}
    assert view.flow_counts("nope")["processed"] == 0


def test_consumer_rows_and_stale(ledger_target: str) -> None:
    open_ledger(ledger_target, flow="a").close()
    now = datetime.now(UTC)
    rows = [
        ("h:1:1", 2.0, "running", {"breaker": "open", "in_flight": 3}),  # fresh
        ("h:2:1", 20.0, "running", {}),  # 20 s old, beating every 5 s: stale
        ("h:3:1", 9999.0, "stopped", {}),  # stopped long ago: never stale
    ]
    import psycopg

    from onceq._ledger.target import is_pg_url
    from support import open_db

    sql = "INSERT INTO {t} VALUES ('a', %s, 'h', 7, %s, %s, 5, %s)"
    values = [
        (
            cid,
            (now - timedelta(seconds=age + 1)).isoformat(),
            (now - timedelta(seconds=age)).isoformat(),
            json.dumps({"status": status, **extra}),
        )
        for cid, age, status, extra in rows
    ]
    if is_pg_url(ledger_target):
        with psycopg.connect(ledger_target, autocommit=True) as conn:
            for v in values:
                conn.execute(sql.format(t="onceq.consumers"), v)  # type: ignore[arg-type]
    else:
        with open_db(ledger_target) as conn:
            for v in values:
                conn.execute(sql.format(t="consumers").replace("%s", "?"), v)
    view = LedgerView(ledger_target).read(now)
    got = {c["consumer"]: c for c in view.consumers["a"]}
    assert got["h:1:1"]["status"] == "running" and not got["h:1:1"]["stale"]
    assert got["h:1:1"]["breaker"] == "open" and got["h:1:1"]["in_flight"] == 3
    assert got["h:2:1"]["status"] == "stale" and got["h:2:1"]["stale"]
    assert got["h:3:1"]["status"] == "stopped" and not got["h:3:1"]["stale"]
    assert [c["consumer"] for c in view.consumers["a"]] == ["h:1:1", "h:2:1", "h:3:1"]


def test_an_unreachable_pg_ledger_is_one_line() -> None:
    with pytest.raises(LedgerUnavailable) as exc:
        LedgerView("postgresql://postgres:s3cr3t-pw@127.0.0.1:1/x").read()
    assert "s3cr3t-pw" not in str(exc.value) and "\n" not in str(exc.value)


def test_the_sqlite_read_refuses_writes(tmp_path: object) -> None:
    """mode=ro: even a bug in a query could not change the ledger."""
    import sqlite3
    from pathlib import Path

    from onceq._ops.ledger_read import read_only

    db = Path(str(tmp_path)) / "ledger.db"
    open_ledger(db, flow="a").close()
    with read_only(db) as reading, pytest.raises(sqlite3.OperationalError):
        reading.rows(
            "INSERT INTO messages (flow, msg_id, processed_at, source) VALUES ('a','m','t','x')"
        )


def test_the_pg_read_is_a_read_only_transaction(pg_url: str) -> None:
    import psycopg

    from onceq._ops.pg_sessions import read_session

    open_ledger(pg_url, flow="a").close()
    with (
        read_session(pg_url, "x") as (rows, tables),
        pytest.raises(psycopg.errors.ReadOnlySqlTransaction),
    ):
        rows("INSERT INTO messages (flow, msg_id, processed_at, source) VALUES ('a','m','t','x')")
    assert "consumers" in tables
