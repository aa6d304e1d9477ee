"""The PostgreSQL ledger when its connection is lost: reads fail fast, commits wait it
out and never write a group twice (a lost COMMIT's answer is looked up, not guessed).

Outages are made per database, never by stopping the server (other tests share it):
pg_terminate_backend of the ledger's sessions (application_name onceq), and for a
longer one ALTER DATABASE … ALLOW_CONNECTIONS false first.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from onceq._core.effect import SqlEffect
from onceq._core.transport import Delivery, Kind, Settle
from onceq._ledger.pg.reconnect import Reconnector
from onceq._ledger.sqlite import Entry
from onceq._ledger.target import open_ledger
from onceq.errors import LedgerError, LedgerUnavailable
from pg_support import ADMIN_URL

pytestmark = pytest.mark.pg


def admin(sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        cur = conn.execute(sql, args or None)
        return cur.fetchall() if cur.description else []


def dbname(url: str) -> str:
    return url.rsplit("/", 1)[1]


def terminate(url: str) -> int:
    """Kill every onceq session of the database; how many there were."""
    rows = admin(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = %s AND application_name = 'onceq'",
        dbname(url),
    )
    return len(rows)


@contextlib.contextmanager
def outage(url: str) -> Iterator[None]:
    """The database refuses connections (and has none of ours) until the block ends."""
    admin(f'ALTER DATABASE "{dbname(url)}" ALLOW_CONNECTIONS false')
    try:
        terminate(url)
        yield
    finally:
        admin(f'ALTER DATABASE "{dbname(url)}" ALLOW_CONNECTIONS true')


def success(msg_id: str, ref: str) -> Entry:
    d = Delivery(b"{}", ref, msg_id, stable_ref=True)
    return Entry(d, Kind.SUCCESS, Settle.ACK, fields={"group": "A", "seq": 1, "kept": {}})


def wait_for(cond: Any, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def test_a_blip_costs_a_read_nothing(pg_url: str, caplog: Any) -> None:
    """The reader's session was killed while idle: the read reconnects once and answers."""
    with open_ledger(pg_url) as ledger:
        ledger.commit([success("m1", "a")])
        assert terminate(pg_url) == 2  # the writer and the reader
        assert ledger.processed_ref("m1") == "a"
        assert ledger.ping()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "connection lost" in warnings[0] and "reconnecting" in warnings[0]
    assert "reconnected after" in warnings[1]


def test_a_commit_after_the_session_was_killed_goes_through(pg_url: str) -> None:
    with open_ledger(pg_url) as ledger:
        ledger.commit([success("m1", "a")])
        terminate(pg_url)
        group = [success("m2", "b"), success("m1", "c")]
        ledger.commit(group)
        assert [e.kind for e in group] == [Kind.SUCCESS, Kind.DUPLICATE]
        assert ledger.counts() == {"processed": 2, "duplicates": 1, "failures": 0, "replays": 0}


def test_during_an_outage_reads_fail_fast_and_a_commit_waits_for_the_database(
    pg_url: str, caplog: Any
) -> None:
    secret = pg_url.replace("postgres@", "postgres:s3cr3t@")
    with open_ledger(secret) as ledger:
        ledger.commit([success("m1", "a")])
        group = [success("m2", "b"), success("m1", "c")]
        errors: list[BaseException] = []
        with outage(pg_url):
            t = threading.Thread(target=lambda: _commit(ledger, group, errors))
            t.start()
            wait_for(lambda: any("connection lost" in r.getMessage() for r in caplog.records))
            for _ in range(3):
                start = time.monotonic()
                with pytest.raises(LedgerUnavailable) as info:
                    ledger.processed_ref("m1")
                assert time.monotonic() - start < 3.0  # never the commit's long wait
                assert "s3cr3t" not in str(info.value)
            assert not ledger.ping()
            time.sleep(1.0)  # a second of outage: the commit is still waiting
            assert t.is_alive()
        t.join(timeout=20)
        assert not t.is_alive() and errors == []
        assert [e.kind for e in group] == [Kind.SUCCESS, Kind.DUPLICATE]
        assert ledger.ping()
        assert ledger.counts() == {"processed": 2, "duplicates": 1, "failures": 0, "replays": 0}
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "s3cr3t" not in text and "postgres:***@" in text
    lost = [r for r in caplog.records if "connection lost" in r.getMessage()]
    back = [r for r in caplog.records if "reconnected after" in r.getMessage()]
    assert len(lost) == 1 and len(back) == 1


def _commit(ledger: Any, group: list[Entry], errors: list[BaseException]) -> None:
    try:
        ledger.commit(group)
    except BaseException as exc:  # handed to the test's thread
        errors.append(exc)


def test_interrupt_makes_a_waiting_commit_give_up(pg_url: str, caplog: Any) -> None:
    with open_ledger(pg_url) as ledger:
        group = [success("m1", "a")]
        errors: list[BaseException] = []
        with outage(pg_url):
            t = threading.Thread(target=lambda: _commit(ledger, group, errors))
            t.start()
            wait_for(lambda: any("connection lost" in r.getMessage() for r in caplog.records))
            ledger.interrupt()
            t.join(timeout=10)
            assert not t.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], LedgerError)
        assert "stopped while waiting" in str(errors[0])
    with open_ledger(pg_url) as again:
        assert again.counts()["processed"] == 0


# warm: a group before, so the group under test is sent whole in a transaction begun
# ahead (`onceq._ledger.pg.ahead`): its id, looked up here, came with that COMMIT.
@pytest.mark.parametrize("warm", [False, True], ids=["first-group", "begun-ahead"])
def test_a_lost_commit_answer_is_looked_up_not_written_twice(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, warm: bool
) -> None:
    """The COMMIT reached the server, its answer did not: after reconnecting, the
    group is found committed (pg_xact_status) and its verdicts stand: SUCCESS, not
    DUPLICATE of itself, and the failure row is not written again."""
    real = Reconnector.transaction
    lose_answer = [True]

    @contextlib.contextmanager
    def lossy(self: Reconnector, conn: psycopg.Connection[Any]) -> Iterator[None]:
        with real(self, conn):
            yield
        if lose_answer.pop() if lose_answer else False:
            terminate(pg_url)
            conn.execute("SELECT 1")  # raises: the session is gone, as the answer was

    with open_ledger(pg_url) as ledger:
        if warm:
            ledger.commit([success("m0", "z")])
        monkeypatch.setattr(Reconnector, "transaction", lossy)
        fail = Entry(Delivery(b"{}", "f", "m9"), Kind.TRANSIENT, Settle.REQUEUE, "http-503")
        group = [success("m1", "a"), success("m2", "b"), fail]
        ledger.commit(group)
        assert [e.kind for e in group] == [Kind.SUCCESS, Kind.SUCCESS, Kind.TRANSIENT]
        assert not any(e.recovered for e in group)
        assert ledger.counts() == {
            "processed": 2 + warm,
            "duplicates": 0,
            "failures": 1,
            "replays": 0,
        }
        assert ledger.failed_attempts("m9") == 1


def test_a_session_lost_inside_the_group_writes_the_group_again(pg_url: str) -> None:
    """Lost before the COMMIT (here: in the SQL effect of the first try): nothing of
    that try is durable, and the same group is written again once, effect and all."""
    calls: list[str] = []

    def effect(tx: Any, doc: dict[str, Any]) -> None:
        calls.append(doc["id"])
        tx.execute("INSERT INTO business (id) VALUES (%s)", (doc["id"],))
        if len(calls) == 1:
            terminate(pg_url)
            tx.execute("SELECT 1")  # raises: the session is gone

    sql = SqlEffect(effect, setup="CREATE TABLE IF NOT EXISTS business (id TEXT PRIMARY KEY)")
    with open_ledger(pg_url, sql=sql) as ledger:
        group = [success("m1", "a"), success("m2", "b")]
        for e in group:
            e.fields["doc"] = {"id": e.delivery.msg_id}
        ledger.commit(group)
        assert [e.kind for e in group] == [Kind.SUCCESS, Kind.SUCCESS]
        assert calls == ["m1", "m1", "m2"]
        assert ledger.query("SELECT id FROM business ORDER BY id")[1] == [("m1",), ("m2",)]
        assert ledger.counts()["processed"] == 2


@pytest.mark.parametrize("warm", [False, True], ids=["first-group", "begun-ahead"])
def test_a_session_the_server_still_holds_is_ended_and_the_group_written_again(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, warm: bool
) -> None:
    """The connection was lost before the COMMIT but the server has not noticed (a cut
    network): the old session still holds the group's transaction, 'in progress'.
    The commit ends that session itself (pg_terminate_backend), so the transaction's
    verdict becomes final (aborted) and the group is written again, once."""
    import onceq._ledger.pg.reconnect as reconnect

    class Cut(psycopg.OperationalError):
        pass

    real_check = reconnect.is_connection_error
    monkeypatch.setattr(
        reconnect,
        "is_connection_error",
        lambda exc, conn=None: isinstance(exc, Cut) or real_check(exc, conn),
    )
    held: list[psycopg.Connection[Any]] = []
    keep: list[Any] = []
    real = Reconnector.transaction

    with open_ledger(pg_url) as ledger:
        if warm:  # the group under test is sent whole (see the lost COMMIT's test)
            ledger.commit([success("m0", "z")])

        @contextlib.contextmanager
        def cut(self: Reconnector, conn: psycopg.Connection[Any]) -> Iterator[None]:
            if held:
                with real(self, conn):
                    yield
                return
            gen = real(self, conn)
            gen.__enter__()
            yield  # the group's rows are written, the COMMIT is never sent
            held.append(conn)  # the old session lives on, its transaction open
            keep.append(gen)  # (not collected: that would roll it back)
            gone = psycopg.connect(pg_url)
            gone.close()
            ledger._write = gone  # what the client sees: a dead connection
            raise Cut("network cut")

        monkeypatch.setattr(Reconnector, "transaction", cut)
        group = [success("m1", "a"), success("m2", "b")]
        errors: list[BaseException] = []
        t = threading.Thread(target=lambda: _commit(ledger, group, errors))
        t.start()
        t.join(timeout=30)
        if t.is_alive():  # waiting for ever on the old session: the bug this test catches
            ledger.interrupt()
            t.join()
        assert errors == []
        assert [e.kind for e in group] == [Kind.SUCCESS, Kind.SUCCESS]
        assert ledger.counts()["processed"] == 2 + warm
        with pytest.raises(psycopg.OperationalError):  # the old session was ended
            held[0].execute("SELECT 1")
