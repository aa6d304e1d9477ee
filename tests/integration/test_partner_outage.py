"""A partner stub's outage modes, on a real stub process (onceq._exercise.partner.outage).

refuse: connections refused on the port for the window, then it listens again on the
same port; 503: every call answered 503 (+ Retry-After), counted apart from the rule
set's counters; hang: calls answered only after the window (a client timeout fires
first). The window ends by itself; the stub prints one line down and one line back.
"""

from __future__ import annotations

import http.client
import json
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from cli_support import invoke
from mq_support import partner, post, wait_for

CLAIM = json.dumps({"guid": "G-1", "claimId": "C-1", "docs": ["a.pdf"]}).encode()


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def _call(url: str, timeout: float = 10) -> tuple[int, dict[str, str]]:
    """POST the claim; (status, headers). An error status is returned, not raised."""
    req = urllib.request.Request(f"{url}/v1/claims", data=CLAIM, headers={"Idempotency-Key": "G-1"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


def _lines(proc: Any, n: int) -> list[str]:
    return [proc.stdout.readline().strip() for _ in range(n)]


def test_refuse_from_the_start_then_the_same_port_listens_again() -> None:
    with partner(args=("--down-for", "3", "--down-as", "refuse")) as p:
        # The listening line is printed once it is already down: no moment of "up".
        down_at = time.monotonic()
        assert _lines(p.proc, 1) == ["claim system stub down (refuse) for 3s"]
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", p.port), timeout=2)
        assert _refused(p.port)
        wait_for(lambda: not _refused(p.port), timeout=15)
        # Not back early (the line came after the outage began: no lower tolerance
        # is needed), and not late beyond a loaded machine's slack.
        assert 2.9 <= time.monotonic() - down_at < 10
        assert _lines(p.proc, 1) == ["claim system stub back up"]
        assert _call(p.url)[0] == 201
        stats = p.stats()
        assert stats["outage"] is None
        assert stats["by_guid"] == {"G-1": 1} and stats["calls_during_outage"] == 0


def test_refuse_by_request_closes_kept_alive_connections_too() -> None:
    with partner() as p:
        conn = http.client.HTTPConnection("127.0.0.1", p.port, timeout=5)
        conn.request("POST", "/v1/claims", body=CLAIM, headers={"Idempotency-Key": "G-1"})
        first = conn.getresponse()
        assert first.status == 201 and first.read()
        conn.request("POST", "/_outage?mode=refuse&seconds=2")
        answer = json.loads(conn.getresponse().read())
        assert answer["outage"]["mode"] == "refuse"
        assert _lines(p.proc, 1) == ["claim system stub down (refuse) for 2s"]
        # The kept-alive connection is closed by the stub: a call on it gets nothing.
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            conn.request("POST", "/v1/claims", body=CLAIM, headers={"Idempotency-Key": "G-1"})
            conn.getresponse()
        conn.close()
        assert _refused(p.port)
        wait_for(lambda: not _refused(p.port), timeout=15)
        assert _lines(p.proc, 1) == ["claim system stub back up"]
        assert _call(p.url)[0] == 201
        assert p.stats()["by_guid"] == {"G-1": 2}


def test_503_with_retry_after_is_counted_apart_from_the_rule_set() -> None:
    with partner(args=("--down-for", "2", "--down-as", "503", "--retry-after", "7")) as p:
        assert _lines(p.proc, 1) == ["claim system stub down (503) for 2s"]
        answers = [_call(p.url) for _ in range(3)]
        assert [s for s, _ in answers] == [503, 503, 503]
        assert all(h["Retry-After"] == "7" for _, h in answers)
        stats = p.stats()
        assert stats["outage"]["mode"] == "503" and 0 < stats["outage"]["remaining_s"] <= 2
        assert stats["calls_during_outage"] == 3 and stats["by_status"] == {"503": 3}
        # The application never saw them: "called exactly once" still reads by_guid.
        assert stats["total"] == 3 and stats["by_guid"] == {} and stats["by_key"] == {}
        wait_for(lambda: p.stats()["outage"] is None, timeout=15)
        assert _lines(p.proc, 1) == ["claim system stub back up"]
        status, headers = _call(p.url)
        assert status == 201 and "Retry-After" not in headers
        stats = p.stats()
        assert stats["by_guid"] == {"G-1": 1} and stats["by_status"] == {"503": 3, "201": 1}


def test_503_without_retry_after_sends_no_header() -> None:
    with partner(keys=False) as p:
        p.outage("503", 5)
        status, headers = _call(p.url)
        assert status == 503 and "Retry-After" not in headers


def test_hang_outlasts_a_client_timeout_and_answers_only_after_the_window() -> None:
    with partner() as p:
        p.outage("hang", 3)
        started = time.monotonic()
        with pytest.raises((TimeoutError, socket.timeout, urllib.error.URLError)):
            _call(p.url, timeout=0.5)
        # A patient client is answered, with 504, only once the window is over.
        remaining = p.stats()["outage"]["remaining_s"]
        t0 = time.monotonic()
        status, _ = _call(p.url, timeout=20)
        assert status == 504
        assert time.monotonic() - t0 >= remaining - 0.05
        assert time.monotonic() - started >= 2.9
        stats = p.stats()
        assert stats["calls_during_outage"] == 2 and stats["by_guid"] == {}
        assert stats["outage"] is None
        assert _call(p.url)[0] == 201


def test_a_stop_during_a_hang_does_not_wait_for_the_window() -> None:
    with partner(keys=False) as p:
        p.outage("hang", 60)
        got: list[object] = []

        def hung_call() -> None:
            try:
                got.append(_call(p.url, timeout=30)[0])
            except (OSError, http.client.HTTPException) as exc:
                got.append(exc)

        t = threading.Thread(target=hung_call, daemon=True)
        t.start()
        wait_for(lambda: p.stats()["calls_during_outage"] == 1, timeout=10)
        t0 = time.monotonic()
        p.proc.send_signal(signal.SIGTERM)
        assert p.proc.wait(timeout=10) == 0
        assert time.monotonic() - t0 < 5
        t.join(timeout=10)
        # The hung call was let go (its 504, or the connection closed), not left to hang.
        assert not t.is_alive() and len(got) == 1 and got != [201], got


def test_outage_requests_that_cannot_be_had_are_refused_and_change_nothing() -> None:
    with partner(keys=False) as p:

        def ask(query: str) -> tuple[int, dict[str, Any]]:
            return post(f"{p.url}/_outage?{query}", b"")

        for query in (
            "mode=down&seconds=2",
            "mode=503&seconds=0",
            "mode=503&seconds=-1",
            "mode=503&seconds=nan",
            "mode=503&seconds=inf",
            "mode=503",
            "mode=503&seconds=2&retry_after=x",
            "mode=hang&seconds=2&retry_after=3",
            "mode=503&seconds=2&retry_after=-1",
        ):
            status, answer = ask(query)
            assert status == 400 and answer["error"], query
            assert p.stats()["outage"] is None, query
        assert ask("mode=503&seconds=30")[0] == 200
        status, answer = ask("mode=hang&seconds=2")
        assert status == 409 and "503" in answer["error"]
        assert p.stats()["outage"]["mode"] == "503"
        # A reset clears the counter, not the outage under way.
        _call(p.url)
        assert p.stats()["calls_during_outage"] == 1
        p._post("/_reset")
        stats = p.stats()
        assert stats["calls_during_outage"] == 0 and stats["outage"]["mode"] == "503"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--down-as", "503"], "onceq: --down-as: needs --down-for SECONDS"),
        (["--retry-after", "3"], "onceq: --retry-after: needs --down-for SECONDS"),
        (
            ["--down-for", "2", "--retry-after", "3"],
            "onceq: --retry-after: only with --down-as 503 (a header of the 503 answer)",
        ),
        (
            ["--down-for", "2", "--down-as", "hang", "--retry-after", "3"],
            "onceq: --retry-after: only with --down-as 503 (a header of the 503 answer)",
        ),
    ],
)
def test_option_mistakes_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    r = invoke("partner", "claim", "--port", "0", *args, timeout=30)
    assert r.returncode == 2, r
    assert r.stderr.strip() == message and r.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ["--down-for", "0"],
        ["--down-for", "-1"],
        ["--down-for", "nan"],
        ["--down-for", "86401"],
        ["--down-as", "slow", "--down-for", "1"],
        ["--down-for", "1", "--down-as", "503", "--retry-after", "-1"],
    ],
)
def test_option_values_out_of_range_exit_2(args: list[str]) -> None:
    r = invoke("partner", "invoices", "--port", "0", *args, timeout=30)
    assert r.returncode == 2, r
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_a_stub_that_cannot_listen_again_ends_with_one_line_not_down_for_ever() -> None:
    with partner(keys=False, args=("--down-for", "1", "--down-as", "refuse")) as p:
        # Someone else takes the port while it is down.
        thief = socket.socket()
        try:
            thief.bind(("127.0.0.1", p.port))
            thief.listen()
            assert p.proc.wait(timeout=30) == 1
        finally:
            thief.close()
        assert p.proc.stderr is not None
        err = p.proc.stderr.read().strip()
        assert err.startswith(f"onceq: 127.0.0.1:{p.port}: cannot listen again after the outage")
        assert "Traceback" not in err and len(err.splitlines()) == 1
