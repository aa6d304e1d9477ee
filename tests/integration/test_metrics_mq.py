"""/metrics and /healthz of `mq consume`: counts during and after a run, health flips.

Real broker, real partner stub, the CLI as a user runs it. /healthz must say 503 when
the broker drops the connection and 200 after the reconnect, 503 from the first stop
signal while the in-flight calls finish; a port in use refuses the run before anything
is consumed; no password or header value reaches a scrape.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

from metrics_support import (
    Scrape,
    answers,
    expected_failures,
    expected_messages,
    healthz,
    make_invoices,
)
from mq_support import (
    claim_doc,
    ctl,
    partner,
    publish,
    queues,
    start_consumer,
    topology,
    vhost,
    wait_for,
    write_claims,
)
from support import free_port

FLOW = ("--flow", "claims")


def _claims(tmp: Path) -> list[Path]:
    """6 new claims, a second copy of the first, 2 without docs (422), 1 BUSY (503)."""
    docs = [claim_doc(f"g-{i}") for i in range(6)]
    docs.append(claim_doc("g-0"))
    docs += [claim_doc("r-1", docs=[]), claim_doc("r-2", docs=[])]
    docs.append(claim_doc("b-1", claim_id="BUSY-1"))
    return write_claims(tmp / "c", docs)


# Settled entries: 6 processed, 1 duplicate, 2 dead (422), the BUSY one requeued once
# (the exercise's rule) then dead: 11.
ENTRIES = 11


def _connections(url: str) -> list[str]:
    lines = ctl("list_connections", "pid", "vhost").splitlines()
    return [pid for pid, v in (ln.split("\t") for ln in lines if "\t" in ln) if v == vhost(url)]


def test_counts_during_and_after_equal_the_summary(amqp_url: str, tmp_path: Path) -> None:
    topology(amqp_url)
    publish(amqp_url, *_claims(tmp_path))
    port = free_port()
    with partner() as p:
        p.hold()
        proc = start_consumer(
            amqp_url, p.url, tmp_path / "l.db", "--metrics-port", str(port), *FLOW
        )
        try:
            wait_for(lambda: answers(port) and p.held() >= 1, timeout=30)
            during = Scrape(port)
            assert during.value("onceq_in_flight", flow="claims") >= 1
            assert during.settled("claims") < ENTRIES
            assert during.value("onceq_effect_duration_seconds_count", flow="claims") == 0
            assert healthz(port) == (200, {"status": "ok", "flows": {"claims": "ok"}})
            p.release()
            wait_for(lambda: Scrape(port).settled("claims") == ENTRIES, timeout=30)
            after = Scrape(port)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert after.messages("claims") == expected_messages(summary)
    assert after.failures("claims") == expected_failures(summary)
    assert after.failures("claims") == {"http-422": 2, "http-503": 2}
    # Dead by reason, apart from the retried attempts: the summary's own reasons.
    assert after.dead("claims") == summary["reasons"] == {"http-422": 2, "http-503": 1}
    assert after.messages("claims")["processed"] == 6
    assert after.messages("claims")["duplicate"] == 1
    assert after.value("onceq_in_flight", flow="claims") == 0
    assert after.value("onceq_effect_duration_seconds_count", flow="claims") == 10


def test_queue_depths_come_from_the_broker(amqp_url: str, tmp_path: Path) -> None:
    topology(amqp_url)
    publish(amqp_url, *_claims(tmp_path))
    port = free_port()
    with partner() as p:
        p.hold()
        proc = start_consumer(
            amqp_url, p.url, tmp_path / "l.db", "--metrics-port", str(port), "--prefetch", "2"
        )
        try:
            wait_for(lambda: answers(port) and p.held() == 2, timeout=30)

            def depths() -> dict[str, float]:
                return Scrape(port).by("onceq_queue_messages", "state", flow="default")

            # 10 published, 2 taken (unacked, their calls held): 8 ready. Unacked comes
            # from the management API, whose statistics lag by up to 5 s.
            want = {"ready": 8, "unacked": 2, "dead": 0}
            wait_for(lambda: depths() == want, timeout=30, step=0.5)
            p.release()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=60)


def test_healthz_503_while_the_broker_connection_is_lost_200_after(
    amqp_url: str, tmp_path: Path
) -> None:
    topology(amqp_url)
    port = free_port()
    with partner() as p:
        proc = start_consumer(
            amqp_url, p.url, tmp_path / "l.db", "--metrics-port", str(port), *FLOW
        )
        try:
            wait_for(lambda: answers(port) and healthz(port)[0] == 200, timeout=30)
            # The consumer's connection and the queue depth reader's.
            wait_for(lambda: len(_connections(amqp_url)) == 2, timeout=15)
            pids = _connections(amqp_url)
            # Dropped, and kept out while the test looks (its reconnects refused): the
            # robust connection would otherwise be back within milliseconds.
            ctl("clear_permissions", "-p", vhost(amqp_url), "guest")
            for pid in pids:
                ctl("close_connection", pid, "onceq test: dropped on purpose")
            lost = (503, {"status": "unavailable", "flows": {"claims": "broker connection lost"}})
            wait_for(lambda: healthz(port) == lost, timeout=30)
            ctl("set_permissions", "-p", vhost(amqp_url), "guest", ".*", ".*", ".*")
            ok = (200, {"status": "ok", "flows": {"claims": "ok"}})
            wait_for(lambda: healthz(port) == ok, timeout=30)
            assert not set(_connections(amqp_url)) & set(pids)  # new connections
            assert Scrape(port).value("onceq_flow_up", flow="claims") == 1
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out)["received"] == 0


def test_healthz_503_from_the_stop_signal_while_finishing(amqp_url: str, tmp_path: Path) -> None:
    topology(amqp_url)
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc(f"s-{i}") for i in range(3)]))
    port = free_port()
    with partner() as p:
        p.hold()
        proc = start_consumer(
            amqp_url, p.url, tmp_path / "l.db", "--metrics-port", str(port), "--timeout", "60",
            *FLOW,
        )  # fmt: skip
        try:
            wait_for(lambda: answers(port) and p.held() == 3, timeout=30)
            assert healthz(port)[0] == 200
            proc.send_signal(signal.SIGTERM)
            # The calls are still held, so the consumer is finishing, and says so.
            stopping = (503, {"status": "unavailable", "flows": {"claims": "stopping"}})
            wait_for(lambda: healthz(port) == stopping, timeout=15)
            assert proc.poll() is None
            p.release()
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err
    assert json.loads(out)["processed"] == 3
    assert not answers(port)  # closed cleanly at the end


def test_a_port_in_use_refuses_the_run_before_anything(amqp_url: str, tmp_path: Path) -> None:
    topology(amqp_url)
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc(f"p-{i}") for i in range(2)]))
    db = tmp_path / "l.db"
    with socket.socket() as held, partner() as p:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = subprocess.run(
            [sys.executable, "-m", "onceq", "mq", "consume", "--claim", p.url, "--db", str(db),
             "--metrics-port", str(port), "--until-empty"],
            capture_output=True,
            text=True,
            env={**__import__("os").environ, "EAI_AMQP_URL": amqp_url},
            timeout=60,
        )  # fmt: skip
        calls = p.stats()["total"]
    assert r.returncode == 4, r.stderr
    assert r.stderr == f"onceq: 127.0.0.1:{port}: cannot serve metrics: the port is in use\n"
    assert not db.exists()
    assert calls == 0
    assert queues(amqp_url)["claim.in"] == (2, 0)


def _scrape_texts(port: int) -> list[str]:
    return [Scrape(port).text, json.dumps(healthz(port)[1])]


def test_no_password_or_header_value_in_any_scrape(amqp_url: str, tmp_path: Path) -> None:
    """A broker password, an HTTP effect URL's password and a header value: never shown."""
    user, pw = f"onceq-m-{uuid.uuid4().hex[:8]}", f"BrokerPw{uuid.uuid4().hex[:10]}"
    http_pw, header = f"HttpPw{uuid.uuid4().hex[:10]}", f"Hdr{uuid.uuid4().hex[:10]}"
    ctl("add_user", user, pw)
    try:
        ctl("set_permissions", "-p", vhost(amqp_url), user, ".*", ".*", ".*")
        url = amqp_url.replace("guest:guest@", f"{user}:{pw}@")
        topology(url)
        publish(url, *_claims(tmp_path))
        port = free_port()
        with partner() as p:
            claim = p.url.replace("http://", f"http://bob:{http_pw}@")
            proc = start_consumer(url, claim, tmp_path / "l.db", "--metrics-port", str(port))
            try:
                wait_for(lambda: answers(port) and Scrape(port).settled("default") == ENTRIES, 30)
                texts = _scrape_texts(port)
            finally:
                proc.send_signal(signal.SIGTERM)
                out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert json.loads(out)["processed"] == 6
    finally:
        ctl("delete_user", user)
    # The HTTP effect of a directory queue: a URL password and a header value.
    q = make_invoices(tmp_path / "q")
    with partner(kind="invoices", keys=False) as p:
        p.hold()
        effect = p.url.replace("http://", f"http://bob:{http_pw}@") + "/api/invoices"
        dirq = subprocess.Popen(
            [sys.executable, "-m", "onceq", "dirq", "consume", str(q), "--id-field",
             "invoiceId", "--url", effect, "--header", f"X-Api-Key: {header}",
             "--retry", "exercise", "--metrics-port", str(port), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            wait_for(lambda: answers(port) and p.held() >= 1, timeout=30)
            texts += _scrape_texts(port)
            p.release()
            dout, derr = dirq.communicate(timeout=60)
        finally:
            if dirq.poll() is None:
                dirq.kill()
                dirq.communicate()
    assert dirq.returncode == 0, derr
    for secret in (pw, http_pw, header):
        for text in (*texts, out, err, dout, derr):
            assert secret not in text
