"""Faults on a running consumer: SIGTERM / SIGINT mid-run, a connection the broker drops."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from mq_support import (
    claim_doc,
    ctl,
    partner,
    publish,
    queues,
    rows,
    start_consumer,
    topology,
    vhost,
    wait_for,
    write_claims,
)

pytestmark = pytest.mark.broker


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_mid_run_exits_0_and_loses_nothing(
    amqp_url: str, tmp_path: Path, sig: signal.Signals
) -> None:
    n = 30
    topology(amqp_url)
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc(f"s-{i}") for i in range(n)]))
    db = tmp_path / "processed.db"
    with partner(delay=0.5) as p:
        proc = start_consumer(amqp_url, p.url, db, "--prefetch", "5")
        wait_for(lambda: p.stats()["total"] >= 7, timeout=15)  # calls are in flight now
        t0 = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=15)
        took = time.monotonic() - t0
        stats = p.stats()
    assert proc.returncode == 0, err
    assert took < 5, took  # in-flight calls (0.5 s each) finish, nothing more is taken
    summary = json.loads(out)
    done = {r[0] for r in rows(db, "SELECT msg_id FROM processed")}
    ready, unacked = queues(amqp_url)["claim.in"]
    assert unacked == 0
    # Nothing lost: every message is either recorded (and acked) or back in claim.in.
    assert len(done) + ready == n
    assert 7 <= len(done) < n
    # Nothing called twice, and every call that answered 201 was recorded.
    assert set(stats["by_guid"].values()) == {1}
    assert set(stats["by_guid"]) == done
    assert summary["processed"] == len(done)


def _connections(url: str) -> list[str]:
    # The table form: its pids are what close_connection accepts (JSON's "#PID<…>" is not).
    lines = ctl("list_connections", "pid", "vhost").splitlines()
    return [pid for pid, v in (ln.split("\t") for ln in lines if "\t" in ln) if v == vhost(url)]


def test_dropped_connection_reconnects_and_finishes_each_claim_once(
    amqp_url: str, tmp_path: Path
) -> None:
    n = 30
    topology(amqp_url)
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc(f"d-{i}") for i in range(n)]))
    db = tmp_path / "processed.db"
    with partner(delay=0.3) as p:
        proc = start_consumer(amqp_url, p.url, db, "--prefetch", "5", "--max-seconds", "9")
        wait_for(lambda: p.stats()["total"] >= 6, timeout=15)
        pids = _connections(amqp_url)
        assert len(pids) == 1, pids
        # The broker drops the consumer's connection while calls are in flight.
        ctl("close_connection", pids[0], "onceq test: dropped on purpose")
        wait_for(lambda: _connections(amqp_url) not in ([], pids), timeout=10, step=0.3)
        out, err = proc.communicate(timeout=30)
        stats = p.stats()
    assert proc.returncode == 0, err
    assert stats["total"] == n, stats  # each guid called exactly once …
    assert set(stats["by_guid"].values()) == {1}
    assert rows(db, "SELECT count(*) FROM processed") == [(n,)]  # … recorded …
    assert queues(amqp_url)["claim.in"] == (0, 0)  # … and acked
    assert "Traceback" not in err
    summary = json.loads(out)
    assert summary["processed"] == n
    # Calls were in flight when the channel died: their acks failed (a warning, not a
    # crash), and the copies the broker redelivered were acked as already done.
    assert summary["unsettled"] >= 1 and "could not ack" in err
    # … and recognised by their copy id as recovered work, not re-sent duplicates.
    assert summary["recovered"] >= summary["unsettled"] and summary["duplicates"] == 0


def _silent_broker() -> tuple[socket.socket, int]:
    """A TCP port that accepts connections and never says a word (a hung broker)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    return s, s.getsockname()[1]


def test_a_silent_broker_ends_the_consumer_after_the_connect_timeout(tmp_path: Path) -> None:
    """connect_robust kept reconnecting after its first attempt timed out, so the
    process reported nothing and never exited; now: exit 7 after CONNECT_TIMEOUT."""
    listener, port = _silent_broker()
    try:
        t0 = time.monotonic()
        proc = start_consumer(
            f"amqp://guest:s3cret@127.0.0.1:{port}/v", "http://127.0.0.1:9", tmp_path / "l.db"
        )
        try:
            out, err = proc.communicate(timeout=18)  # CONNECT_TIMEOUT is 10 s
        finally:
            proc.kill()  # a consumer that hangs must not outlive the test
        took = time.monotonic() - t0
    finally:
        listener.close()
    assert proc.returncode == 7, err
    assert "no answer within" in err and "s3cret" not in err + out
    assert took < 14, took
    assert not (tmp_path / "l.db").exists()


def _hanging_claim_system() -> tuple[socket.socket, int, list[socket.socket]]:
    """Accepts claim calls and never answers them."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(s.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    return s, s.getsockname()[1], held


def test_a_second_signal_stops_at_once_and_loses_nothing(amqp_url: str, tmp_path: Path) -> None:
    """The first SIGINT waits for in-flight calls (up to --timeout); a second one does not."""
    topology(amqp_url)
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc(f"h-{i}") for i in range(3)]))
    listener, port, held = _hanging_claim_system()
    db = tmp_path / "processed.db"
    try:
        proc = start_consumer(amqp_url, f"http://127.0.0.1:{port}", db, "--timeout", "30")
        wait_for(lambda: len(held) == 3, timeout=15)  # three calls hang now
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)  # the first signal is being handled: the grace period runs
        assert proc.poll() is None  # … it waits for the in-flight calls
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
        took = time.monotonic() - t0
    finally:
        listener.close()
    assert proc.returncode == 130, err
    assert took < 3, took
    assert "second signal" in err and json.loads(out)["aborted"] is True
    # Nothing settled, nothing recorded: all three are back in claim.in.
    wait_for(lambda: queues(amqp_url)["claim.in"] == (3, 0), timeout=10)
    assert rows(db, "SELECT count(*) FROM processed") == [(0,)]


def test_sigterm_while_disconnected_exits_at_once(amqp_url: str, tmp_path: Path) -> None:
    """The broker drops the connection and refuses the reconnect; SIGTERM then ends the
    run at once (it waited CONNECT_TIMEOUT to cancel a consumer that no longer existed),
    the outage is reported once, without the password, and nothing is lost."""
    n = 40
    topology(amqp_url)
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc(f"o-{i}") for i in range(n)]))
    db = tmp_path / "processed.db"
    with partner(delay=0.3) as p:
        proc = start_consumer(amqp_url, p.url, db, "--prefetch", "5")
        wait_for(lambda: p.stats()["total"] >= 6, timeout=15)
        ctl("clear_permissions", "-p", vhost(amqp_url), "guest")  # reconnects are refused
        try:
            ctl("close_all_connections", "-p", vhost(amqp_url), "onceq test: outage")
            time.sleep(2.5)  # several reconnect attempts (1 s apart) fail
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=20)
            took = time.monotonic() - t0
        finally:
            ctl("set_permissions", "-p", vhost(amqp_url), "guest", ".*", ".*", ".*")
        stats = p.stats()
    assert proc.returncode == 0, err
    assert took < 3, (took, err)
    assert err.count("lost (") == 1, err  # one warning per outage, not one per attempt
    assert "guest:***@" in err and "Traceback" not in err
    done = {r[0] for r in rows(db, "SELECT msg_id FROM processed")}
    assert set(stats["by_guid"].values()) == {1}
    summary = json.loads(out)
    assert summary["processed"] == len(done)
    # Each message is recorded or back in claim.in; those recorded whose ack died with
    # the connection are back too (the ledger skips them next time).
    ready = queues(amqp_url)["claim.in"]
    assert ready == (n - len(done) + summary["unsettled"], 0), (ready, summary)


def test_kill_9_mid_run_loses_nothing_and_a_restart_finishes(amqp_url: str, tmp_path: Path) -> None:
    """A consumer killed with SIGKILL while calls are in flight: nothing is lost (no ack
    precedes its record), and a second consumer finishes the rest. Only the claims in
    flight at the kill (at most prefetch) may be called twice."""
    n, prefetch = 30, 5
    topology(amqp_url)
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc(f"k-{i}") for i in range(n)]))
    db = tmp_path / "processed.db"
    with partner(delay=0.3) as p:
        proc = start_consumer(amqp_url, p.url, db, "--prefetch", str(prefetch))
        wait_for(lambda: p.stats()["total"] >= 12, timeout=15)
        proc.kill()
        proc.communicate(timeout=10)
        before = len(rows(db, "SELECT msg_id FROM processed"))
        wait_for(lambda: queues(amqp_url)["claim.in"][1] == 0, timeout=10)  # unacked return
        rest = start_consumer(amqp_url, p.url, db, "--prefetch", str(prefetch))
        try:
            wait_for(lambda: rows(db, "SELECT count(*) FROM processed") == [(n,)], timeout=20)
        finally:
            rest.terminate()
            out, err = rest.communicate(timeout=15)
        stats = p.stats()
    assert rest.returncode == 0, err
    assert 0 < before < n
    assert {r[0] for r in rows(db, "SELECT msg_id FROM processed")} == {f"k-{i}" for i in range(n)}
    assert queues(amqp_url)["claim.in"] == (0, 0)
    twice = [g for g, c in stats["by_guid"].items() if c > 1]
    assert set(stats["by_guid"].values()) <= {1, 2} and len(twice) <= prefetch, stats
    assert json.loads(out)["processed"] == n - before
