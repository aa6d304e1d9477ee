"""Ledger rows for the retention tests (unit and CLI): old and new rows of every kind,
backdated through the ledgers' shared query interface so the same helpers fill an
SQLite file and a PostgreSQL database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from onceq._core.transport import Delivery, Kind, Settle
from onceq._ledger.sqlite import Entry
from onceq._ledger.target import open_ledger

DAY = 86_400.0
NOW = datetime.now(UTC)
OLD = (NOW - timedelta(days=40)).isoformat(timespec="microseconds")


def ok(msg_id: str, ref: str = "") -> Entry:
    return Entry(Delivery(b"{}", ref or f"{msg_id}.json", msg_id), Kind.SUCCESS, Settle.ACK)


def failed(msg_id: str | None, ref: str, settle: Settle = Settle.REQUEUE) -> Entry:
    return Entry(Delivery(b"{}", ref, msg_id), Kind.TRANSIENT, settle, "http-503", "busy")


def backdate(ledger: Any, table: str, col: str, where: str, args: tuple[Any, ...], when: str = OLD):
    with ledger._transaction() as conn:
        conn.execute(f"UPDATE {table} SET {col} = ? WHERE {where}", (when, *args))


def rows(ledger: Any) -> dict[str, set[tuple[Any, ...]]]:
    """Every ledger row, by what identifies it (ids for the id tables)."""
    keys = {
        "messages": "flow, msg_id",
        "duplicates": "flow, msg_id, ref",
        "failures": "flow, id, msg_id",
        "replays": "flow, id, msg_id",
        "dead_ops": "flow, id",
    }
    return {t: set(ledger._rows(f"SELECT {k} FROM {t}")[1]) for t, k in keys.items()}


def fill(target: str, flow: str) -> dict[str, Any]:
    """One flow's rows, old and new, with every case of what must stay; the ids to expect."""
    with open_ledger(target, flow=flow) as led:
        led.commit([ok(f"{flow}-old-{i}") for i in range(5)])
        led.commit([ok(f"{flow}-new-{i}") for i in range(3)])
        backdate(led, "messages", "processed_at", "flow = ? AND msg_id LIKE ?", (flow, "%-old-%"))
        # duplicates: a copy of an old message seen long ago, one of a new one seen now
        led.commit([ok(f"{flow}-old-0", "copy-old.json"), ok(f"{flow}-new-0", "copy-new.json")])
        backdate(led, "duplicates", "seen_at", "flow = ? AND ref = ?", (flow, "copy-old.json"))
        # done: failed twice long ago, then succeeded (its failures may all go)
        led.commit([failed(f"{flow}-done", "d1.json")])
        led.commit([failed(f"{flow}-done", "d2.json")])
        # waiting: failed long ago and again now (in a retry tier): both stay
        led.commit([failed(f"{flow}-waiting", "w1.json")])
        led.commit([failed(f"{flow}-waiting", "w2.json")])
        # never parsed, long ago: goes
        led.commit([failed(None, "junk.json", Settle.DEAD)])
        # replayed: dead long ago, replayed long ago, then failed once more now: the
        # replay hides the old failure, which stays (its message has a new one), so the
        # replay stays too (else the old failure would count again)
        led.commit([failed(f"{flow}-replayed", "r1.json", Settle.DEAD)])
        led.record_replay("r1.json")
        led.commit([failed(f"{flow}-replayed", "r2.json")])
        # dead long ago and replayed long ago, then nothing: replay and failure go
        led.commit([failed(f"{flow}-gone", "g1.json", Settle.DEAD)])
        led.record_replay("g1.json")
        backdate(
            led,
            "failures",
            "at",
            "flow = ? AND ref IN (?,?,?,?,?,?)",
            (flow, "d1.json", "d2.json", "w1.json", "junk.json", "r1.json", "g1.json"),
        )
        backdate(led, "replays", "at", "flow = ?", (flow,))
        # dead-letter operations: finished long ago (goes), killed long ago (stays: its
        # finished_at is NULL), finished now (stays)
        finished_old = led.start_op("dirq", "replay", {}, "q")
        led.finish_op(finished_old)
        killed = led.start_op("dirq", "purge", {}, "q")
        finished_new = led.start_op("dirq", "replay", {}, "q")
        led.finish_op(finished_new)
        backdate(
            led, "dead_ops", "started_at", "flow = ? AND id IN (?,?)", (flow, finished_old, killed)
        )
        backdate(led, "dead_ops", "finished_at", "flow = ? AND id = ?", (flow, finished_old))
        fid = {
            ref: r[0]
            for ref in ("d1.json", "d2.json", "junk.json", "g1.json")
            for r in [led._q1("SELECT id FROM failures WHERE flow = ? AND ref = ?", (flow, ref))]
        }
        rid = {
            r[1]: r[0]
            for r in led._rows("SELECT id, msg_id FROM replays WHERE flow = ?", (flow,))[1]
        }
        assert led.failed_attempts(f"{flow}-waiting") == 2
        assert led.failed_attempts(f"{flow}-replayed") == 1
        return {
            "messages": {(flow, f"{flow}-old-{i}") for i in range(5)},
            "duplicates": {(flow, f"{flow}-old-0", "copy-old.json")},
            "failures": {
                (flow, fid["d1.json"], f"{flow}-done"),
                (flow, fid["d2.json"], f"{flow}-done"),
                (flow, fid["junk.json"], None),
                (flow, fid["g1.json"], f"{flow}-gone"),
            },
            "replays": {(flow, rid[f"{flow}-gone"], f"{flow}-gone")},
            "dead_ops": {(flow, finished_old)},
        }


def newest_rows_are_new(target: str) -> None:
    """A failure and a replay written after the fills (the newest row of an id table
    stays even when old: the test of that is its own)."""
    with open_ledger(target, flow="c") as led:
        led.commit([failed("c-1", "c.json")])
        led.record_replay("c.json")
