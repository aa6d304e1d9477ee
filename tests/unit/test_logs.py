"""onceq._core.logs: the JSON line (fields, masking, one line whatever is logged), the human
line unchanged, the flow from its contextvar, and log_group's one line per verdict."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from onceq._core import logs, redact
from onceq._core.redact import RedactingStream
from onceq._core.transport import Delivery, Kind, Settle
from onceq._ledger.sqlite import Entry

ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture(autouse=True)
def restored_logging() -> Iterator[None]:
    """Each test sets logging up as a command does; the test process's is put back."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    levels = {n: logging.getLogger(n).level for n in ("aiormq", "aio_pika")}
    redact.forget_all()
    try:
        yield
    finally:
        root.handlers[:], _ = saved[0], root.setLevel(saved[1])
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        logging.captureWarnings(False)
        logs._format = "human"
        redact.forget_all()


def json_setup(level: str = "info") -> io.StringIO:
    """logs.setup("json") writing into a buffer (as the CLI's stderr would receive it)."""
    err = io.StringIO()
    old = sys.stderr
    sys.stderr = err  # StreamHandler() binds sys.stderr when it is made
    try:
        logs.setup("json", level)
    finally:
        sys.stderr = old
    return err


def lines(buf: io.StringIO) -> list[dict[str, Any]]:
    raw = buf.getvalue().splitlines()
    assert raw, "nothing was logged"
    return [json.loads(line) for line in raw]


def test_a_json_line_has_the_fixed_fields() -> None:
    err = json_setup()
    logging.getLogger("onceq.test").warning(
        "queue %s: slow", "q1", extra={"event": "consumer-timeout", "msg_id": "m-1"}
    )
    (line,) = lines(err)
    assert ISO_MS.match(line["time"]), line["time"]
    assert line["level"] == "warning"
    assert line["logger"] == "onceq.test"
    assert line["event"] == "consumer-timeout"
    assert line["msg_id"] == "m-1"
    assert line["message"] == "queue q1: slow"
    assert line["flow"] is None  # logged outside any flow
    assert "reason" not in line and "exception" not in line  # only where there is one


def test_an_exception_is_one_field_never_a_traceback_outside_the_line() -> None:
    err = json_setup()
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        logging.getLogger("onceq.consumer").exception(
            "handler failed on %s", "r1", extra={"event": "handler-failed"}
        )
    raw = err.getvalue()
    assert raw.count("\n") == 1  # one line, the traceback inside it
    (line,) = lines(err)
    assert line["event"] == "handler-failed"
    assert "Traceback" in line["exception"] and "ValueError: bad\nthing" in line["exception"]


def test_a_url_password_in_the_arguments_or_the_exception_is_masked() -> None:
    err = json_setup()
    url = "amqp://alice:hunter2PW@127.0.0.1:5672/v"
    try:
        raise ConnectionError(f"cannot reach {url}")
    except ConnectionError:
        logging.getLogger("psycopg.pool").error("connect to %s", url, exc_info=True)
    raw = err.getvalue()
    assert "hunter2PW" not in raw
    (line,) = lines(err)
    assert line["message"] == "connect to amqp://alice:***@127.0.0.1:5672/v"
    assert "amqp://alice:***@127.0.0.1" in line["exception"]
    assert line["event"] == "log"  # another library's line: no event of ours


def test_a_remembered_secret_is_masked_in_any_field_whoever_logs_it() -> None:
    redact.remember_secret("Bearer tok-9f8e7d6c")
    err = json_setup()
    logging.getLogger("aiohttp.client").warning(
        "partner said: invalid token tok-9f8e7d6c", extra={"reason": "tok-9f8e7d6c"}
    )
    raw = err.getvalue()
    assert "tok-9f8e7d6c" not in raw
    (line,) = lines(err)
    assert line["reason"] == "***" and line["message"] == "partner said: invalid token ***"


def test_non_ascii_survives_as_ascii_json() -> None:
    err = json_setup()
    text = "café ☕ 日本 \udcff"  # a lone surrogate: an undecodable byte of a file name
    logging.getLogger("onceq.test").warning("%s", text, extra={"msg_id": "ünï"})
    assert err.getvalue().isascii()
    (line,) = lines(err)
    assert line["message"] == text and line["msg_id"] == "ünï"


def test_the_stderr_guard_keeps_a_line_with_two_ats_whole() -> None:
    """The CLI's stderr re-masks each line (URL pattern to the line's last '@'): a URL in
    the message and an '@' in msg_id must not cut the object apart."""
    err = json_setup()
    logging.getLogger("onceq.test").warning(
        "to amqp://u:pw12345@h/v", extra={"msg_id": "sip:alice@example.com", "event": "log"}
    )
    guarded = io.StringIO()
    stream = RedactingStream(guarded)  # type: ignore[arg-type]
    stream.write(err.getvalue())
    stream.flush()
    (line,) = lines(guarded)
    assert line["message"] == "to amqp://u:***@h/v"
    assert line["msg_id"] == "sip:***@example.com"  # masked by pattern, never less
    assert "pw12345" not in guarded.getvalue()


def test_arguments_that_do_not_fit_still_make_one_line() -> None:
    err = json_setup()
    logging.getLogger("onceq.test").warning("%d items", "not a number")
    (line,) = lines(err)
    assert "%d items" in line["message"] and "not a number" in line["message"]


def test_a_python_warning_is_a_json_line_too() -> None:
    err = json_setup()
    warnings.warn("old thing", DeprecationWarning, stacklevel=1)
    (line,) = lines(err)
    assert line["event"] == "python-warning" and "old thing" in line["message"]


def test_the_level_filters_and_the_noisy_libraries_stay_quiet() -> None:
    err = json_setup("warning")
    logging.getLogger("onceq.test").info("not shown")
    logging.getLogger("aiormq.connection").error("reconnect chatter")
    logging.getLogger("aio_pika.robust_connection").warning("more chatter")
    logging.getLogger("onceq.test").warning("shown")
    assert [ln["message"] for ln in lines(err)] == ["shown"]


def test_the_human_line_is_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup()  # the default: human, warning
    logging.getLogger("onceq.amqp.transport").warning(
        "reconnected to %s", "amqp://u:s3cr3tH@h/", extra={"event": "reconnected"}
    )
    logging.getLogger("onceq.amqp.transport").info("not shown")
    assert (
        capsys.readouterr().err
        == "onceq: WARNING onceq.amqp.transport: reconnected to amqp://u:***@h/\n"
    )


def test_a_record_carries_the_flow_of_its_context_and_its_tasks() -> None:
    err = json_setup()
    log = logging.getLogger("onceq.test")

    async def later() -> None:
        await asyncio.sleep(0)
        log.warning("from a task")  # a callback or task made inside the flow's context

    async def main() -> None:
        with logs.flow_context("invoices"):
            task = asyncio.get_running_loop().create_task(later())
            log.warning("inside")
            log.warning("named", extra={"flow": "other"})
        log.warning("outside")
        await task

    asyncio.run(main())
    got = [(ln["message"], ln["flow"]) for ln in lines(err)]
    assert got == [
        ("inside", "invoices"),
        ("named", "other"),
        ("outside", None),
        ("from a task", "invoices"),
    ]


def entry(msg_id: str, kind: Kind, settle: Settle, reason: str = "", **kw: Any) -> Entry:
    delay = kw.pop("delay", 0.0)
    fields = kw.pop("fields", {})
    return Entry(
        Delivery(b"{}", f"ref-{msg_id}", msg_id=msg_id, delay=delay),
        kind,
        settle,
        reason,
        fields=fields,
        **kw,
    )


def test_log_group_logs_each_verdict_that_is_not_a_plain_success() -> None:
    err = json_setup()
    group = [
        entry("ok", Kind.SUCCESS, Settle.ACK),
        entry("pd", Kind.SUCCESS, Settle.ACK, fields={"partner_duplicate": True}),
        entry("dup", Kind.DUPLICATE, Settle.ACK),
        entry("rq", Kind.TRANSIENT, Settle.REQUEUE, "http-503", attempt=1),
        entry("dl", Kind.TRANSIENT, Settle.DELAY, "connect-error", attempt=2, delay=30.0),
        entry("dead", Kind.REJECTED, Settle.DEAD, "http-422", attempt=1),
        entry("gave-up", Kind.TRANSIENT, Settle.DEAD, "http-503", attempt=3),
        entry("held", Kind.HELD, Settle.RELEASE, "breaker-open"),
        entry("rec", Kind.SUCCESS, Settle.ACK, recovered=True),
    ]
    logs.log_group("invoices", group)
    got = {ln["msg_id"]: ln for ln in lines(err)}
    assert "ok" not in got  # a plain success: counted, not logged
    assert {k: v["event"] for k, v in got.items()} == {
        "pd": "duplicate",
        "dup": "duplicate",
        "rq": "retry",
        "dl": "retry",
        "dead": "dead",
        "gave-up": "dead",
        "held": "held",
        "rec": "recovered",
    }
    assert all(v["flow"] == "invoices" and v["level"] == "info" for v in got.values())
    assert got["pd"]["reason"] == "partner-duplicate"
    assert (got["rq"]["reason"], got["rq"]["delay"], got["rq"]["attempt"]) == ("http-503", 0, 1)
    assert (got["dl"]["reason"], got["dl"]["delay"], got["dl"]["attempt"]) == (
        "connect-error",
        30.0,
        2,
    )
    assert (got["gave-up"]["reason"], got["gave-up"]["attempt"]) == ("http-503", 3)
    assert got["held"]["reason"] == "breaker-open"
    assert got["dead"]["message"] == "dead dead: http-422 (attempt 1)"


class _Untouchable:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"log_group looked at an entry ({name}) with INFO off")


def test_log_group_does_nothing_per_entry_when_info_is_off() -> None:
    err = json_setup("warning")
    logs.log_group("f", [_Untouchable()] * 1000)  # type: ignore[list-item]
    assert err.getvalue() == ""


def test_say_is_the_plain_line_or_a_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup()
    logs.say("amqp://u:pw-say-1@h/: login refused", "error")
    assert capsys.readouterr().err == "onceq: amqp://u:pw-say-1@h/: login refused\n"
    err = json_setup("warning")
    logs.say("amqp://u:pw-say-1@h/: login refused", "error")
    (line,) = lines(err)
    assert (line["event"], line["level"]) == ("error", "error")
    assert "pw-say-1" not in err.getvalue()


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="human or json"):
        logs.setup("xml")


def test_every_outcome_the_counters_know_has_its_event() -> None:
    """A new outcome in onceq._core.stats must be given an event (or None: not logged)."""
    from onceq._core.stats import OUTCOMES

    assert set(logs.OUTCOME_EVENTS) == set(OUTCOMES)
    assert {e for e in logs.OUTCOME_EVENTS.values() if e} <= set(logs.EVENTS)


class _BadPipeline:
    def __repr__(self) -> str:
        return "<psycopg.AsyncPipeline [BAD] at 0x7f00deadbeef>"


def test_psycopgs_error_ignored_terminating_is_dropped_its_other_lines_are_not() -> None:
    """A terminated session's pipeline: psycopg's second error, with the object's repr,
    repeats what onceq reports ("connection lost"): no line, in either format."""
    err = json_setup("info")
    psycopg_log = logging.getLogger("psycopg")
    psycopg_log.warning("error ignored terminating %r: %s", _BadPipeline(), "server closed")
    assert err.getvalue() == ""
    psycopg_log.warning("some other psycopg warning")
    assert [x["message"] for x in lines(err)] == ["some other psycopg warning"]


def test_a_retry_copys_cause_is_a_field_of_its_json_line() -> None:
    err = json_setup("info")
    logging.getLogger("onceq.amqp.transport").warning(
        "its copy was not confirmed",
        extra={"event": "retry-copy-unconfirmed", "msg_id": "m-1", "cause": "access-refused"},
    )
    (line,) = lines(err)
    assert line["event"] == "retry-copy-unconfirmed" and line["cause"] == "access-refused"
