"""`--log-format json` on real runs: every stderr line is a JSON object with time, level
and event; the dead and retried messages are there with their reasons; no password or
header value anywhere; a dropped broker connection is logged with the flow's name.

Real processes: `onceq mq consume` against RabbitMQ as a user of the test's own (a
password that must not leak), `onceq dirq consume` against a scripted HTTP partner
whose URL carries a password and whose calls carry a secret header.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest

from cli_support import invoke
from dirq_retry_support import make_queue, scripted_partner
from mq_support import (
    EXERCISE,
    claim_doc,
    cli,
    consumers,
    count,
    ctl,
    partner,
    publish,
    topology,
    vhost,
    wait_for,
    write_claims,
)
from support import http_server

JSON = ("--log-format", "json", "--log-level", "info")


@pytest.fixture
def user_url(amqp_url: str) -> Iterator[tuple[str, str]]:
    """(URL, password) of a broker user made for this test alone, on the test's vhost."""
    name = f"onceq-logs-{uuid.uuid4().hex[:8]}"
    password = f"pw-{uuid.uuid4().hex}"
    ctl("add_user", name, password)
    try:
        ctl("set_permissions", "-p", vhost(amqp_url), name, ".*", ".*", ".*")
        yield amqp_url.replace("guest:guest@", f"{name}:{password}@", 1), password
    finally:
        ctl("delete_user", name)


def json_lines(stderr: str) -> list[dict[str, Any]]:
    """Every stderr line as an object; fails on the first line that is not one."""
    out = []
    for n, line in enumerate(stderr.splitlines(), 1):
        try:
            obj = json.loads(line)
        except ValueError:
            raise AssertionError(f"stderr line {n} is not JSON: {line!r}") from None
        assert isinstance(obj, dict), line
        for key in ("time", "level", "event"):
            assert obj.get(key), (key, line)
        out.append(obj)
    return out


def by_event(lines: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [ln for ln in lines if ln["event"] == event]


def _claims(tmp_path: Path) -> list[Path]:
    return write_claims(
        tmp_path / "c",
        [
            claim_doc("ok-1"),
            claim_doc("ok-2"),
            claim_doc("rej-1", docs=[]),  # 422: dead at once
            claim_doc("busy-1", claim_id="BUSY-1"),  # 503: requeued once, then dead
        ],
    )


def test_mq_consume_logs_json_lines_with_the_verdicts_and_no_password(
    user_url: tuple[str, str], tmp_path: Path
) -> None:
    url, password = user_url
    topology(url)
    publish(url, *_claims(tmp_path))
    db = tmp_path / "processed.db"
    with partner() as p:
        r = cli(url, "mq", "consume", "--claim", p.url, "--db", str(db), "--json",
                *EXERCISE, "--until-empty", *JSON)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert password not in r.stderr and password not in r.stdout
    lines = json_lines(r.stderr)
    summary = json.loads(r.stdout)
    assert summary["reasons"] == {"http-422": 1, "http-503": 1}
    dead = {ln["msg_id"]: ln for ln in by_event(lines, "dead")}
    assert set(dead) == {"rej-1", "busy-1"}
    assert dead["rej-1"]["reason"] == "http-422" and dead["rej-1"]["attempt"] == 1
    assert dead["busy-1"]["reason"] == "http-503" and dead["busy-1"]["attempt"] == 2
    (retry,) = by_event(lines, "retry")  # the exercise's rule: requeued once, at once
    assert (retry["msg_id"], retry["reason"], retry["delay"]) == ("busy-1", "http-503", 0)
    assert {ln["flow"] for ln in [*dead.values(), retry]} == {"default"}
    assert by_event(lines, "new-ledger"), "the run's own stderr note is a JSON line too"
    assert not [ln for ln in lines if ln.get("msg_id") in ("ok-1", "ok-2")]  # successes: quiet


def test_the_human_format_is_the_default_and_unchanged(amqp_url: str, tmp_path: Path) -> None:
    topology(amqp_url)
    publish(amqp_url, *_claims(tmp_path))
    db = tmp_path / "processed.db"
    with partner() as p:
        r = cli(amqp_url, "mq", "consume", "--claim", p.url, "--db", str(db), "--json",
                *EXERCISE, "--until-empty")  # fmt: skip
        assert r.returncode == 0, r.stderr
        # The default level (warning): only the new ledger's note, as before.
        assert r.stderr.splitlines() == [f"onceq: new ledger at {db}: no message seen before"]
        publish(amqp_url, *_claims(tmp_path / "again"))
        r = cli(amqp_url, "mq", "consume", "--claim", p.url, "--db", str(db), "--json",
                *EXERCISE, "--until-empty", "--log-level", "info")  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert "onceq: INFO onceq.messages: duplicate ok-1" in lines
    # rej-1 again: its second dead letter (the ledger counts attempts across runs).
    assert "onceq: INFO onceq.messages: dead rej-1: http-422 (attempt 2)" in lines
    assert not [ln for ln in lines if ln.startswith("{")]


def _connections(url: str) -> list[str]:
    # The table form: its pids are what close_connection accepts (JSON's "#PID<…>" is not).
    lines = ctl("list_connections", "pid", "vhost").splitlines()
    return [pid for pid, v in (ln.split("\t") for ln in lines if "\t" in ln) if v == vhost(url)]


def test_a_dropped_connection_is_logged_with_the_flow_name(
    user_url: tuple[str, str], tmp_path: Path
) -> None:
    url, password = user_url
    topology(url)
    db = tmp_path / "processed.db"
    with partner() as p:
        proc = subprocess.Popen(
            [sys.executable, "-m", "onceq", "mq", "consume", "--claim", p.url,
             "--db", str(db), "--json", *EXERCISE, "--flow", "claims-watch", *JSON],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "EAI_AMQP_URL": url},
        )  # fmt: skip
        try:
            wait_for(lambda: consumers(url) == 1, timeout=30, step=0.2)
            pids = _connections(url)
            assert len(pids) == 1, pids
            ctl("close_connection", pids[0], "onceq test: dropped on purpose")
            # Back once a new connection has its consumer registered again.
            wait_for(lambda: _connections(url) not in ([], pids), timeout=30, step=0.3)
            wait_for(lambda: consumers(url) == 1, timeout=30, step=0.2)
            publish(url, *write_claims(tmp_path / "c", [claim_doc("after-drop")]))
            wait_for(lambda: count(db, "processed") == 1, timeout=30)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert password not in err and password not in out
    lines = json_lines(err)
    (lost,) = by_event(lines, "connection-lost")
    (back,) = by_event(lines, "reconnected")
    assert lost["flow"] == back["flow"] == "claims-watch"
    assert lost["level"] == back["level"] == "warning"
    assert lines.index(lost) < lines.index(back)
    assert "***@" in lost["message"]  # the URL is named, its password masked


def test_dirq_consume_logs_json_lines_with_no_password_or_header_value(tmp_path: Path) -> None:
    q = make_queue(tmp_path, ["ok", "rej", "flaky", "down"])
    token = f"key-{uuid.uuid4().hex}"
    plan = {
        "rej": [(422, None)],
        "flaky": [(503, None)],  # then 201: retried after 1 s
        "down": [(503, None), (503, None)],  # out of attempts: dead
    }
    with scripted_partner(plan=plan) as p:
        secret_url = p.url.replace("http://", "http://user:s3cretPW@", 1)
        r = invoke(
            "dirq", "consume", str(q), "--id-field", "id", "--url", secret_url,
            "--header", f"X-Api-Key: {token}", "--flow", "invoices", "--json",
            "--immediate-retries", "0", "--retry-delays", "1s", "--no-breaker", *JSON,
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    for secret in ("s3cretPW", token):
        assert secret not in r.stderr and secret not in r.stdout
    lines = json_lines(r.stderr)
    assert json.loads(r.stdout)["reasons"] == {"http-422": 1, "http-503": 1}
    dead = {ln["msg_id"]: ln for ln in by_event(lines, "dead")}
    assert {k: (v["reason"], v["attempt"]) for k, v in dead.items()} == {
        "rej": ("http-422", 1),
        "down": ("http-503", 2),
    }
    retried = {ln["msg_id"]: ln for ln in by_event(lines, "retry")}
    assert {k: (v["reason"], v["delay"]) for k, v in retried.items()} == {
        "flaky": ("http-503", 1.0),
        "down": ("http-503", 1.0),
    }
    assert {ln["flow"] for ln in [*dead.values(), *retried.values()]} == {"invoices"}
    assert p.by_id()["flaky"] == [503, 201]


def test_the_breaker_s_changes_are_json_lines_with_their_events(tmp_path: Path) -> None:
    """Every id fails once (503) then succeeds: the breaker opens after two failures,
    probes, and closes on the first success — each change one line with its event."""
    q = make_queue(tmp_path, [f"m{i:02d}" for i in range(20)])
    with scripted_partner(fail_first=1) as p:
        r = invoke(
            "dirq", "consume", str(q), "--id-field", "id", "--url", p.url, "--flow", "invoices",
            "--json", "--immediate-retries", "0", "--retry-delays", "300ms",
            "--breaker-failures", "2", "--breaker-probe", "300ms", *JSON,
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = json_lines(r.stderr)
    changes = [ln for ln in lines if ln["event"].startswith("breaker-")]
    events = [ln["event"] for ln in changes]
    assert events[0] == "breaker-open" and events[-1] == "breaker-closed", events
    assert "breaker-half-open" in events
    assert {ln["flow"] for ln in changes} == {"invoices"}
    assert {ln["level"] for ln in changes} == {"warning"}
    held = by_event(lines, "held")  # what the open breaker gave back untried
    assert held and {ln["reason"] for ln in held} == {"breaker-open"}
    assert json.loads(r.stdout)["processed"] == 20


def test_a_refused_login_is_one_json_line_without_the_password(
    user_url: tuple[str, str], tmp_path: Path
) -> None:
    url, password = user_url
    wrong = f"wrong-{password}"
    bad_url = url.replace(password, wrong, 1)
    r = cli(bad_url, "mq", "consume", "--claim", "http://127.0.0.1:9", "--db",
            str(tmp_path / "p.db"), "--max-seconds", "5", *JSON)  # fmt: skip
    assert r.returncode == 7, r.stderr  # BrokerUnavailable
    assert wrong not in r.stderr and password not in r.stderr
    (line,) = json_lines(r.stderr)  # the command's one line, as an object
    assert (line["event"], line["level"]) == ("error", "error")
    assert "login refused" in line["message"] and "***@" in line["message"]


@contextmanager
def echoing_partner() -> Iterator[str]:
    """A partner that refuses every id ending in -rej with 422 and a body quoting the
    X-Api-Key it was sent (as a careless partner's error does); 201 for the others."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            ident = str(json.loads(body).get("id"))
            status = 422 if ident.endswith("-rej") else 201
            text = f"invalid key {self.headers.get('X-Api-Key')} for {ident}".encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *args: object) -> None:
            pass

    with http_server(Handler) as url:
        yield f"{url}/api/x"


def test_onceq_run_names_each_flow_in_its_own_lines(tmp_path: Path) -> None:
    """Two directory-queue flows in one process: each verdict line names its own flow,
    and the header value given through ${ENV} appears nowhere, though the partner
    quotes it back (at debug level: every line a library logs is there too)."""
    make_queue(tmp_path, ["a-ok", "a-rej"], name="qa")
    make_queue(tmp_path, ["b-ok", "b-rej"], name="qb")
    token = f"tok-{uuid.uuid4().hex}"
    with echoing_partner() as url:
        flows = tmp_path / "flows.toml"
        flows.write_text(
            'ledger = "./flows.db"\n'
            + "".join(
                f'[flows.{name}]\nsource = "dirq"\npath = "./{q}"\nid_field = "id"\n'
                f'[flows.{name}.http]\nurl = "{url}"\n'
                'headers = { "X-Api-Key" = "${H3_TEST_KEY}" }\n'
                for name, q in (("alpha", "qa"), ("beta", "qb"))
            )
        )
        r = invoke(
            "run", str(flows), "--until-empty", "--log-format", "json", "--log-level", "debug",
            env={"H3_TEST_KEY": token},
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert token not in r.stderr and token not in r.stdout
    dead = {ln["msg_id"]: ln["flow"] for ln in by_event(json_lines(r.stderr), "dead")}
    assert dead == {"a-rej": "alpha", "b-rej": "beta"}
    # The partner did quote it: the ledger's detail holds the masked echo.
    with closing(sqlite3.connect(tmp_path / "flows.db")) as conn:
        details = [d for (d,) in conn.execute("SELECT detail FROM failures")]
    assert details and all("invalid key ***" in d and token not in d for d in details)


def test_json_logs_on_a_terminal_draw_no_progress_line(tmp_path: Path) -> None:
    """On a terminal the status line is drawn (test_progress); with JSON logs it is not:
    every stderr line stays an object, whatever stderr is."""
    from test_progress import CLEAR, run_in_pty

    q = make_queue(tmp_path, [f"t{i}" for i in range(5)])
    with scripted_partner() as p:
        code, out = run_in_pty("dirq", "consume", str(q), "--id-field", "id", "--url", p.url, *JSON)
    assert code == 0, out
    assert CLEAR not in out and "settled ·" not in out
    assert f"{q}: 5 received, 5 processed" in out  # the summary (stdout) as before
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    assert lines and all(json.loads(ln)["event"] for ln in lines)
