"""The PostgreSQL group commit's round trips, and what a pipelined statement's failure does.

A group goes to the server in two round trips (`Reconnector.transaction`): BEGIN and
the dedup insert (which returns the transaction id too) together, then the presets'
bulk insert with the COMMIT. Counted from libpq's own protocol trace of the writer:
each Sync (the end of a pipeline), each Flush (a pipeline's answers asked for, the
pipeline left open) and each simple Query the client sends is one wait for the server.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import pq

from onceq._core.effect import SqlEffect
from onceq._core.transport import Delivery, Kind, Settle
from onceq._exercise.processed_table import PROCESSED_TABLE, write_rows
from onceq._ledger.sqlite import Entry
from onceq._ledger.target import open_ledger
from pg_support import ADMIN_URL

pytestmark = pytest.mark.pg


def success(msg_id: str, ref: str) -> Entry:
    d = Delivery(b"{}", ref, msg_id, stable_ref=True)
    return Entry(
        d, Kind.SUCCESS, Settle.ACK, fields={"group": "A", "seq": 1, "kept": {"amount": 1}}
    )


@contextlib.contextmanager
def round_trips(conn: psycopg.Connection[Any]) -> Iterator[list[str]]:
    """The client's messages that wait for the server (Sync, Flush, Query), once the
    block ends."""
    waits: list[str] = []
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield waits
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        # One wait per burst of the client's messages that asks for an answer and is
        # followed by the server's (a Flush right behind a Sync waits for nothing more).
        burst: list[str] = []
        for line in trace:
            fields = line.rstrip("\n").split("\t")
            if fields[0] == "F" and fields[2].startswith(("Sync", "Flush", "Query")):
                burst.append(fields[3].strip(' "') if fields[2] == "Query" else fields[2])
            elif fields[0] == "B" and burst:
                waits.append(burst[0])
                burst = []
        waits.extend(burst[:1])


def test_a_group_with_the_presets_table_is_one_round_trip_after_the_first(pg_url: str) -> None:
    with open_ledger(pg_url, sql=PROCESSED_TABLE) as ledger:
        with round_trips(ledger._write) as waits:
            ledger.commit([success("m0", "r0")])  # the first group of a session
        assert waits == ["Flush", "Sync"]  # BEGIN with the insert; the rest with the COMMIT
        group = [success(f"m{i}", f"r{i}") for i in range(1, 6)]
        with round_trips(ledger._write) as waits:
            ledger.commit(group)
        # Begun with the last COMMIT (its id came back with it): insert, bulk insert,
        # COMMIT AND CHAIN (the next transaction) and its id go out together.
        assert waits == ["Sync"]
        # The id a lost COMMIT is looked up by was in hand before the group was sent,
        # and it is the transaction that committed the group.
        xid = ledger._net.xid
        assert xid is not None
        with psycopg.connect(pg_url, autocommit=True) as conn:
            row = conn.execute("SELECT pg_xact_status(%s::xid8)", (xid,)).fetchone()
            assert row == ("committed",)
            row = conn.execute(
                "SELECT count(*) FROM onceq.messages"
                " WHERE xmin::text::bigint = %s::bigint %% 4294967296",
                (xid,),
            ).fetchone()
            assert row == (5,)
        assert all(e.kind is Kind.SUCCESS for e in group)
        assert ledger.counts()["processed"] == 6
        assert len(ledger.query("SELECT msg_id FROM processed")[1]) == 6


def test_a_group_without_an_effect_is_two_round_trips(pg_url: str) -> None:
    with open_ledger(pg_url) as ledger:
        group = [success("m1", "r1"), success("m2", "r2")]
        with round_trips(ledger._write) as waits:
            ledger.commit(group)
        assert waits == ["Flush", "Sync"]
        assert ledger.counts()["processed"] == 2


def test_a_bulk_row_refused_at_the_commits_round_trip_refuses_that_message_alone(
    pg_url: str,
) -> None:
    """The bulk insert goes out with the COMMIT: its failure (here a `processed` row a
    person left without its dedup row) comes back at that Sync; the COMMIT was skipped
    by the server, the group is written again entry by entry, the guilty one refused."""
    with open_ledger(pg_url, sql=PROCESSED_TABLE) as ledger:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO onceq.processed (msg_id, processed_at, source) VALUES ('m2', 'x', 'y')"
            )
        group = [success("m1", "r1"), success("m2", "r2"), success("m3", "r3")]
        ledger.commit(group)
        assert [e.kind for e in group] == [Kind.SUCCESS, Kind.REJECTED, Kind.SUCCESS]
        assert group[1].reason == "ledger-refused"
        assert ledger.processed_ref("m2") is None
        rows = dict(ledger.query("SELECT msg_id, source FROM processed")[1])
        assert sorted(rows) == ["m1", "m2", "m3"] and rows["m2"] == "y"  # the person's row
        assert ledger.counts() == {"processed": 2, "duplicates": 0, "failures": 1, "replays": 0}


def test_a_session_lost_between_the_two_round_trips_writes_the_group_again_once(
    pg_url: str,
) -> None:
    """Terminated after the insert's round trip, while the bulk insert and the COMMIT
    are queued: their Sync fails, the id already in hand says the transaction did not
    commit, and the same group goes in again (psycopg could not leave pipeline mode on
    that connection: it is closed and counted as lost, not as the group's failure)."""
    calls: list[int] = []

    def bulk(tx: Any, entries: list[Entry]) -> None:
        calls.append(len(entries))
        if len(calls) == 1:
            with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND application_name = 'onceq'",
                    (pg_url.rsplit("/", 1)[1],),
                )
        write_rows(tx, entries)

    sql = SqlEffect(None, setup=PROCESSED_TABLE.setup_postgresql, bulk=bulk)
    with open_ledger(pg_url, sql=sql) as ledger:
        group = [success("m1", "r1"), success("m2", "r2")]
        ledger.commit(group)
        assert [e.kind for e in group] == [Kind.SUCCESS, Kind.SUCCESS]
        assert calls == [2, 2]
        assert ledger.counts() == {"processed": 2, "duplicates": 0, "failures": 0, "replays": 0}
        assert len(ledger.query("SELECT msg_id FROM processed")[1]) == 2
