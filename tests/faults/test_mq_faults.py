"""Faults on a running consumer: SIGTERM / SIGINT mid-run, a connection the broker drops."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker_support import Broker, broker_fixture, empty  # noqa: F401
from mq_support import (
    claim_doc,
    consumers,
    count,
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
from nats_support import nats_names_fixture  # noqa: F401  (the fixture nats_names)

pytestmark = pytest.mark.broker


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_mid_run_exits_0_and_loses_nothing(
    amqp_url: str, tmp_path: Path, sig: signal.Signals
) -> None:
    n, prefetch = 30, 5
    topology(amqp_url)
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc(f"s-{i}") for i in range(n)]))
    db = tmp_path / "processed.db"
    with partner() as p:
        p.hold()
        proc = start_consumer(amqp_url, p.url, db, "--prefetch", str(prefetch), "--timeout", "60")
        # Exactly prefetch calls wait at the stub: none can end, so no ack, so the
        # broker delivers nothing more, whatever the machine's speed.
        wait_for(lambda: p.held() == prefetch, timeout=30)
        in_flight = set(p.stats()["held_keys"])
        proc.send_signal(sig)
        # The signal has been handled once the consumer is cancelled on the broker;
        # only then are the calls answered (else their acks would bring new ones).
        wait_for(lambda: consumers(amqp_url) == 0, timeout=30, step=0.2)
        assert p.release() == prefetch
        out, err = proc.communicate(timeout=60)
        stats = p.stats()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    done = {r[0] for r in rows(db, "SELECT msg_id FROM processed")}
    # The calls in flight at the signal finished and were recorded and acked; nothing
    # more was taken: every other message is back in claim.in.
    assert done == in_flight
    assert queues(amqp_url, exact=True)["claim.in"] == (n - prefetch, 0)
    assert stats["total"] == prefetch and set(stats["by_guid"].values()) == {1}
    assert summary["processed"] == prefetch and summary["unsettled"] == 0


def _connections(url: str) -> list[str]:
    # The table form: its pids are what close_connection accepts (JSON's "#PID<…>" is not).
    lines = ctl("list_connections", "pid", "vhost").splitlines()
    return [pid for pid, v in (ln.split("\t") for ln in lines if "\t" in ln) if v == vhost(url)]


def test_dropped_connection_reconnects_and_finishes_each_claim_once(
    amqp_url: str, tmp_path: Path
) -> None:
    n, prefetch = 30, 5
    topology(amqp_url)
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc(f"d-{i}") for i in range(n)]))
    db = tmp_path / "processed.db"
    with partner() as p:
        p.hold()
        proc = start_consumer(amqp_url, p.url, db, "--prefetch", str(prefetch), "--timeout", "60")
        wait_for(lambda: p.held() == prefetch, timeout=30)  # prefetch calls in flight …
        in_flight = set(p.stats()["held_keys"])
        pids = _connections(amqp_url)
        assert len(pids) == 1, pids
        # … when the broker drops the consumer's connection: their deliveries go back
        # to claim.in, and their acks can only fail.
        ctl("close_connection", pids[0], "onceq test: dropped on purpose")
        # The consumer has seen the drop once it is connected again (a new connection).
        wait_for(lambda: _connections(amqp_url) not in ([], pids), timeout=30, step=0.3)
        assert p.release() == prefetch  # now the held calls answer 201
        wait_for(lambda: count(db, "processed") == n, timeout=60)
        wait_for(lambda: queues(amqp_url, exact=True)["claim.in"] == (0, 0), timeout=30, step=0.3)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        stats = p.stats()
    assert proc.returncode == 0, err
    assert stats["total"] == n, stats  # each guid called exactly once …
    assert set(stats["by_guid"].values()) == {1}
    assert rows(db, "SELECT count(*) FROM processed") == [(n,)]  # … recorded …
    assert queues(amqp_url, exact=True)["claim.in"] == (0, 0)  # … and acked
    assert "Traceback" not in err
    summary = json.loads(out)
    assert summary["processed"] == n
    # The held calls' acks failed on the dead channel (a warning each, not a crash),
    # and the copies the broker redelivered were acked as already done, recognised by
    # their copy id as recovered work, not as re-sent duplicates.
    assert summary["unsettled"] == prefetch, summary
    assert err.count("could not ack") == prefetch, err
    assert all(f"message_id {g})" in err for g in in_flight), err
    assert summary["recovered"] == prefetch and summary["duplicates"] == 0, summary


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
            out, err = proc.communicate(timeout=40)  # CONNECT_TIMEOUT is 10 s
        finally:
            proc.kill()  # a consumer that hangs must not outlive the test
        took = time.monotonic() - t0
    finally:
        listener.close()
    assert proc.returncode == 7, err
    assert "no answer within" in err and "s3cret" not in err + out
    # Ended by the timeout (10 s), not by a hang; the margin is for a loaded machine.
    assert 10 <= took < 30, took
    assert not (tmp_path / "l.db").exists()


@pytest.mark.parametrize("command", ["topology", "publish"])
def test_a_silent_broker_ends_topology_and_publish_after_the_connect_timeout(
    tmp_path: Path, command: str
) -> None:
    """Exit 7 in one line after CONNECT_TIMEOUT, no password, nothing reported done."""
    claim = write_claims(tmp_path / "c", [claim_doc("g-1")])[0]
    args = ["mq", "topology", "--json"] if command == "topology" else ["mq", "publish",
            str(claim), "--json"]  # fmt: skip
    listener, port = _silent_broker()
    try:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "onceq", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "EAI_AMQP_URL": f"amqp://guest:s3cret@127.0.0.1:{port}/v"},
        )  # fmt: skip
        try:
            out, err = proc.communicate(timeout=40)
        finally:
            proc.kill()
        took = time.monotonic() - t0
    finally:
        listener.close()
    assert proc.returncode == 7, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onceq: "), err
    assert "no answer within" in err and "s3cret" not in err + out
    assert out == ""  # no object reported created, no message reported published
    assert 10 <= took < 30, took


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_second_signal_stops_at_once_and_loses_nothing(
    amqp_url: str, tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    """The first signal waits for in-flight calls (up to --timeout); a second one does not,
    and the exit code names it (130 SIGINT, 143 SIGTERM), as for every interrupted run."""
    topology(amqp_url)
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc(f"h-{i}") for i in range(3)]))
    db = tmp_path / "processed.db"
    with partner() as p:
        p.hold()  # the claim system takes the calls and does not answer
        proc = start_consumer(amqp_url, p.url, db, "--timeout", "30")
        wait_for(lambda: p.held() == 3, timeout=30)  # three calls hang now
        proc.send_signal(sig)
        # The first signal has been handled (the consumer is cancelled on the broker)
        # and the grace period runs: it waits for the in-flight calls.
        wait_for(lambda: consumers(amqp_url) == 0, timeout=30, step=0.2)
        assert proc.poll() is None
        t0 = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - t0
    assert proc.returncode == code, err
    assert took < 15, took  # the first signal alone waits the grace: --timeout 30 + 5 s
    assert "second signal" in err and json.loads(out)["aborted"] is True
    # Nothing settled, nothing recorded: all three are back in claim.in.
    wait_for(lambda: queues(amqp_url, exact=True)["claim.in"] == (3, 0), timeout=10)
    assert rows(db, "SELECT count(*) FROM processed") == [(0,)]


def _refusals(url: str) -> int:
    """How often the broker has refused a login to this vhost, from its own log."""
    logs = json.loads(ctl("status", "--formatter", "json"))["log_files"]
    line = f"access to vhost '{vhost(url)}' refused".encode()
    files = [Path(f) for f in logs if f.endswith(".log") and Path(f).is_file()]
    assert files, f"the broker writes no log file this test can read: {logs}"
    return sum(f.read_bytes().count(line) for f in files)


def test_sigterm_while_disconnected_exits_at_once(amqp_url: str, tmp_path: Path) -> None:
    """The broker drops the connection and refuses the reconnect; SIGTERM then ends the
    run at once (it waited CONNECT_TIMEOUT to cancel a consumer that no longer existed),
    the outage is reported once, without the password, and nothing is lost."""
    n = 40
    topology(amqp_url)
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc(f"o-{i}") for i in range(n)]))
    db = tmp_path / "processed.db"
    with partner() as p:
        p.hold()
        proc = start_consumer(amqp_url, p.url, db, "--prefetch", "5", "--timeout", "60")
        wait_for(lambda: p.held() == 5, timeout=30)  # calls in flight at the outage
        ctl("clear_permissions", "-p", vhost(amqp_url), "guest")  # reconnects are refused
        try:
            refused = _refusals(amqp_url)
            ctl("close_all_connections", "-p", vhost(amqp_url), "onceq test: outage")
            # Several reconnect attempts (1 s apart) have failed: the broker says so.
            wait_for(lambda: _refusals(amqp_url) >= refused + 2, timeout=30, step=0.2)
            p.release()
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=20)
            took = time.monotonic() - t0
        finally:
            ctl("set_permissions", "-p", vhost(amqp_url), "guest", ".*", ".*", ".*")
        stats = p.stats()
    assert proc.returncode == 0, err
    # At once: before, it waited CONNECT_TIMEOUT (10 s) to cancel a dead consumer.
    assert took < 8, (took, err)
    assert err.count("lost (") == 1, err  # one warning per outage, not one per attempt
    assert "guest:***@" in err and "Traceback" not in err
    done = {r[0] for r in rows(db, "SELECT msg_id FROM processed")}
    assert set(stats["by_guid"].values()) == {1}
    summary = json.loads(out)
    assert summary["processed"] == len(done)
    # Each message is recorded or back in claim.in; those recorded whose ack died with
    # the connection are back too (the ledger skips them next time).
    ready = queues(amqp_url, exact=True)["claim.in"]
    assert ready == (n - len(done) + summary["unsettled"], 0), (ready, summary)


def test_kill_9_mid_run_loses_nothing_and_a_restart_finishes(
    broker: Broker, tmp_path: Path
) -> None:
    """A consumer (RabbitMQ or NATS) killed with SIGKILL while calls are in flight:
    nothing is lost (no ack precedes its record), and a second consumer finishes the
    rest. Exactly the claims in flight at the kill (prefetch of them) are called twice."""
    n, prefetch = 30, 5
    broker.prepare([claim_doc(f"k-{i}") for i in range(n)])
    db = tmp_path / "processed.db"
    with partner() as p:
        p.hold()
        proc = broker.start(db, p.url, "--prefetch", str(prefetch), "--timeout", "60")
        wait_for(lambda: p.held() == prefetch, timeout=30)
        first = set(p.stats()["held_keys"])
        assert p.release(prefetch) == prefetch  # the first calls are answered …
        # … recorded and acked (the broker then delivered the next ones, held now).
        wait_for(lambda: count(db, "messages") == prefetch and p.held() == prefetch, 30)
        in_flight = set(p.stats()["held_keys"])
        proc.kill()
        proc.communicate(timeout=10)
        before = {r[0] for r in rows(db, "SELECT msg_id FROM messages")}
        broker.returned(held=prefetch)  # unacked return
        p.release()  # the dead consumer's calls are answered, to nobody
        rest = broker.start(db, p.url, "--prefetch", str(prefetch))
        try:
            wait_for(lambda: count(db, "messages") == n, timeout=60)
            # NATS: the acks of the last group go out after its commit; stop once the
            # stream has nothing left in anyone's hands.
            wait_for(lambda: broker.state() == empty(broker), timeout=30, step=0.2)
        finally:
            rest.terminate()
            out, err = rest.communicate(timeout=60)
        stats = p.stats()
    assert rest.returncode == 0, err
    assert before == first
    assert {r[0] for r in rows(db, "SELECT msg_id FROM messages")} == {f"k-{i}" for i in range(n)}
    assert broker.state() == empty(broker)
    twice = {g for g, c in stats["by_guid"].items() if c > 1}
    assert twice == in_flight and set(stats["by_guid"].values()) == {1, 2}, stats
    assert json.loads(out)["processed"] == n - prefetch
