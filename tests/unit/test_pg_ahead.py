"""The PostgreSQL writer begins the next group's transaction with each COMMIT
(`onceq._ledger.pg.ahead`), so a group goes out in one round trip, its insert not
waited for (`PgCommit._insert_rows`). What must hold:

- the transaction begun ahead never waits long: rolled back ~IDLE_S after the last
  group when none comes, and with the session when the ledger closes;
- an operator's write on the writer is never a savepoint of it (durable at once);
- a copy already recorded, or a refused row, in a group sent whole is told apart as
  before (tried again the usual way): DUPLICATE, ledger-refused;
- its id is the group's: a lost COMMIT is looked up by it (test_pg_reconnect).
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from onceq._core.transport import Delivery, Kind, Settle
from onceq._exercise.processed_table import PROCESSED_TABLE
from onceq._ledger.pg import ahead, reconnect
from onceq._ledger.sqlite import Entry
from onceq._ledger.target import open_ledger

pytestmark = pytest.mark.pg


def success(msg_id: str, ref: str) -> Entry:
    d = Delivery(b"{}", ref, msg_id, stable_ref=True)
    return Entry(
        d, Kind.SUCCESS, Settle.ACK, fields={"group": "A", "seq": 1, "kept": {"amount": 1}}
    )


def writer_state(url: str, pid: int) -> tuple[str, Any] | None:
    """(state, backend_xid) of the writer's session, None when it is gone."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT state, backend_xid FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
    return None if row is None else (row[0], row[1])


def test_the_next_transaction_is_rolled_back_soon_when_no_group_comes(pg_url: str) -> None:
    with open_ledger(pg_url, sql=PROCESSED_TABLE) as ledger:
        ledger.commit([success("m1", "r1")])
        pid = ledger._write.info.backend_pid
        state = writer_state(pg_url, pid)
        assert state is not None and state[0] == "idle in transaction" and state[1] is not None
        t0 = time.monotonic()
        while (state := writer_state(pg_url, pid)) != ("idle", None):
            # At most two of the reaper's periods (it looks every IDLE_S), and slack for
            # a loaded machine; never for ever.
            assert time.monotonic() - t0 < 2 * ahead.IDLE_S + 1.0, state
            time.sleep(0.01)
        assert ledger._net.ahead.xid is None
        # The next group begins as usual and still commits.
        group = [success("m2", "r2")]
        ledger.commit(group)
        assert group[0].kind is Kind.SUCCESS
        assert ledger.counts()["processed"] == 2


def test_a_group_every_few_milliseconds_keeps_its_transaction_begun_ahead(pg_url: str) -> None:
    with open_ledger(pg_url) as ledger:
        for i in range(20):
            ledger.commit([success(f"m{i}", f"r{i}")])
            time.sleep(ahead.IDLE_S / 10)
        assert ledger._net.ahead.rolled_back == 0
        assert ledger.counts()["processed"] == 20


def test_closing_the_ledger_ends_the_transaction_begun_ahead(pg_url: str) -> None:
    ledger = open_ledger(pg_url)
    ledger.commit([success("m1", "r1")])
    pid = ledger._write.info.backend_pid
    assert ledger._net.ahead.xid is not None
    reaper = ledger._net.ahead._thread
    assert reaper is not None and reaper.is_alive()
    ledger.close()
    assert not reaper.is_alive()
    t0 = time.monotonic()
    while writer_state(pg_url, pid) is not None:  # the session, and its transaction, gone
        assert time.monotonic() - t0 < 5
        time.sleep(0.01)


def test_an_operators_write_is_durable_at_once_not_part_of_the_next_group(pg_url: str) -> None:
    with open_ledger(pg_url) as ledger:
        ledger.commit([success("m1", "r1")])
        assert ledger._net.ahead.xid is not None
        ledger.record_replay("r1", "m1")
        assert ledger._net.ahead.xid is None
        with psycopg.connect(pg_url, autocommit=True) as conn:  # another session sees it
            row = conn.execute("SELECT count(*) FROM onceq.replays").fetchone()
        assert row == (1,)
        group = [success("m2", "r2")]
        ledger.commit(group)
        assert group[0].kind is Kind.SUCCESS


def test_a_copy_already_recorded_in_a_group_sent_whole_is_a_duplicate(pg_url: str) -> None:
    with open_ledger(pg_url, sql=PROCESSED_TABLE) as ledger:
        ledger.commit([success("m1", "r1")])
        assert ledger._net.ahead.xid is not None  # the next group goes out whole
        group = [success("m2", "r2"), success("m1", "r1-again"), success("m3", "r3")]
        ledger.commit(group)
        assert [e.kind for e in group] == [Kind.SUCCESS, Kind.DUPLICATE, Kind.SUCCESS]
        assert ledger.counts() == {"processed": 3, "duplicates": 1, "failures": 0, "replays": 0}
        # The presets' rows only for the copies that took effect, once each.
        rows = sorted(ledger.query("SELECT msg_id, ref FROM processed")[1])
        assert rows == [("m1", "r1"), ("m2", "r2"), ("m3", "r3")]
        # The next groups wait for their insert's answer a while (a burst of
        # redeliveries costs one extra try, not one per group), then go whole again.
        assert ledger._net.calm == reconnect.CALM_GROUPS
        for i in range(reconnect.CALM_GROUPS + 2):
            ledger.commit([success(f"n{i}", f"s{i}")])
        assert ledger._net.calm == 0
        assert ledger.counts()["processed"] == 3 + reconnect.CALM_GROUPS + 2


def test_a_row_refused_in_a_group_sent_whole_refuses_that_message_alone(pg_url: str) -> None:
    with open_ledger(pg_url, sql=PROCESSED_TABLE) as ledger:
        ledger.commit([success("m0", "r0")])
        assert ledger._net.ahead.xid is not None
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO onceq.processed (msg_id, processed_at, source) VALUES ('m2', 'x', 'y')"
            )
        group = [success("m1", "r1"), success("m2", "r2"), success("m3", "r3")]
        ledger.commit(group)
        assert [e.kind for e in group] == [Kind.SUCCESS, Kind.REJECTED, Kind.SUCCESS]
        assert group[1].reason == "ledger-refused"
        assert ledger.counts() == {"processed": 3, "duplicates": 0, "failures": 1, "replays": 0}


def test_a_large_group_waits_for_its_inserts_answer(pg_url: str, monkeypatch: Any) -> None:
    """Past OPTIMISTIC_MAX a copy already recorded is likelier than a round trip is
    dear (a directory queue's 256): the insert's answer is waited for, as before."""
    from onceq._ledger.pg import commit

    monkeypatch.setattr(commit, "OPTIMISTIC_MAX", 2)
    with open_ledger(pg_url) as ledger:
        ledger.commit([success("m0", "r0")])
        ledger.commit([success("m1", "r1"), success("m2", "r2"), success("m3", "r3")])
        assert ledger._net.pre_begun and not ledger._net.optimistic
        ledger.commit([success("m4", "r4")])
        assert ledger._net.optimistic
        assert ledger.counts()["processed"] == 5


def test_a_group_whose_next_transaction_fails_to_begin_is_still_committed(
    pg_url: str, monkeypatch: Any
) -> None:
    """The COMMIT went through and only the statement behind it failed (here: made to
    fail): the group is done, its verdicts stand, no transaction waits ahead and the
    next group begins as usual."""
    with open_ledger(pg_url) as ledger:
        ledger.commit([success("m0", "r0")])
        monkeypatch.setattr(reconnect, "NEXT_XID", "SELECT (1/0)::text")
        group = [success("m1", "r1"), success("m2", "r2")]
        ledger.commit(group)
        assert [e.kind for e in group] == [Kind.SUCCESS, Kind.SUCCESS]
        assert ledger._net.ahead.xid is None
        assert ledger._write.info.transaction_status.name == "IDLE"
        monkeypatch.undo()
        group = [success("m3", "r3"), success("m1", "r1-again")]
        ledger.commit(group)
        assert [e.kind for e in group] == [Kind.SUCCESS, Kind.DUPLICATE]
        assert ledger.counts() == {"processed": 4, "duplicates": 1, "failures": 0, "replays": 0}


def test_a_copy_already_recorded_whose_error_is_back_before_the_commit_is_queued(
    pg_url: str, monkeypatch: Any
) -> None:
    """psycopg reads the answers already back whenever a statement is queued in a
    pipeline, so the optimistic insert's error can be raised by a statement queued
    after it (the COMMIT, or the next transaction's id behind it) instead of at the
    Sync. Here it is made to be back first (the server is given time to answer before
    the id is queued): the pipeline is still ended and the transaction rolled back, and
    the group is tried again the usual way, a duplicate, not the ledger's error
    ("current transaction is aborted")."""
    with open_ledger(pg_url) as ledger:
        ledger.commit([success("m1", "r1")])
        assert ledger._net.ahead.xid is not None  # the next group goes out whole
        end = reconnect.Reconnector._end

        def late_end(self: Any, conn: Any, tail: Any, done: Any) -> None:
            conn.pgconn.flush()  # what is queued reaches the server, its error comes back
            time.sleep(0.2)
            end(self, conn, tail, done)

        monkeypatch.setattr(reconnect.Reconnector, "_end", late_end)
        group = [success("m1", "r1-again")]
        ledger.commit(group)
        assert [e.kind for e in group] == [Kind.DUPLICATE]
        assert ledger._write.info.transaction_status.name in ("IDLE", "INTRANS")
        monkeypatch.undo()
        group = [success("m2", "r2")]
        ledger.commit(group)
        assert [e.kind for e in group] == [Kind.SUCCESS]
        assert ledger.counts() == {"processed": 2, "duplicates": 1, "failures": 0, "replays": 0}
