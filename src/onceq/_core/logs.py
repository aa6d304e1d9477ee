"""Logging set up for a command: human lines (the default) or one JSON object a line.

Why one module: every command's stderr is read by someone — a person on a terminal
(the human line `onceq: LEVEL name: message`, unchanged since 0.1) or a log shipper
(`--log-format json`: one object a line, each field a value it can index). Both go
through one `setup`, so a library's line (aiormq, aio_pika, psycopg, aiohttp log too)
gets the same masking and the same shape as ours.

    setup("json", "info")
    with flow_context("invoices"):      # every record inside carries flow=invoices
        log.warning("…", extra={"event": "connection-lost"})
    log_group("invoices", entries)      # one INFO line per settled entry worth a look

Secrets: every field of a JSON line passes through `onceq._core.redact.redact_text` (URL
passwords by pattern, remembered secrets such as header values), and so does every
human line, whichever library logged it. The CLI's stderr guard then masks each line
again by pattern; its URL pattern reads from a URL's `user:` to the LAST '@' of the
line, so a JSON line writes '@' as `\\u0040` (a JSON reader reads it back): with one
'@' in a message and another in msg_id, the guard would otherwise cut the object apart.

Events: every log call of the library says what happened in `extra={"event": ...}`,
one of `EVENTS` or of its source's `log_events` (a test reads the source and fails on
a call without one, or with one no table describes), so an operator can alert on an
event by its name.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from onceq._core.redact import redact_text
from onceq._core.stats import outcome_of

__all__ = [
    "EVENTS",
    "FLOW",
    "LOG_FORMATS",
    "JsonFormatter",
    "RedactingFormatter",
    "flow_context",
    "json_mode",
    "log_group",
    "say",
    "setup",
]

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
LOG_FORMATS = ("human", "json")  # --log-format's choices: what `setup` takes
HUMAN = "onceq: %(levelname)s %(name)s: %(message)s"

# Every event of the engine and of every source, and what it means: a source's own
# events are its `SourceType.log_events` (onceq._sources.registry.log_events() gives
# this table and theirs; docs/operations.md shows it, tests/unit/test_log_events.py
# checks every call site of the library against it).
EVENTS: dict[str, str] = {
    # the consume loop's verdicts (log_group: INFO, one line per entry)
    "duplicate": "a msg_id the ledger already holds (or the partner said so): acked, no call",
    "retry": "a transient failure: given back now (delay 0) or copied to a retry tier (delay S)",
    "dead": "dead-lettered (error/ or the dead-letter queue), with its reason",
    "held": "not tried (the breaker is open, the ledger away): given back, no attempt spent",
    "recovered": "a copy a crashed run had already committed: settled now, no second call",
    "decoder-failed": "the decoder raised on a message: dead-lettered as internal-error",
    "handler-failed": "the effect raised (a bug in it): a transient internal-error",
    "config-error": "the request could not be built from the flow's configuration: dead",
    # the circuit breaker
    "breaker-open": "the breaker opened (failures in a row, or a failed probe): calls stop",
    "breaker-half-open": "the breaker lets one probe through",
    "breaker-closed": "the probe succeeded: calls resume",
    # the ledger
    "ledger-lost": "the ledger stopped answering: messages are held until it answers",
    "ledger-back": "the ledger answers again: messages flow again",
    "guard-lost": "the PostgreSQL in-flight guard lost its connection: claims go unguarded",
    "guard-back": "the in-flight guard reconnected",
    "guard-short": "PostgreSQL is out of lock space: claims go unguarded meanwhile",
    "guard-failed": "a batch of the in-flight guard failed (a bug): its claims fail",
    # any broker source (onceq._sources.feed and each transport)
    "connection-lost": "the broker connection was lost: reconnecting",
    "reconnected": "the broker connection is back",
    "drain-check-failed": "the --until-empty drain check failed: asked again",
    "settle-lost": "an ack/reject could not be sent (channel gone): the broker redelivers",
    "grace-expired": "in-flight deliveries did not finish within the grace: back to the queue",
    # the metrics (onceq._ops.telemetry, onceq._ops.metrics_queues, onceq._sources.amqp.depths)
    "depth-reader-stopped": "the queue depth reader failed: the depth figures stop, not the run",
    "depths-failed": "reading the queue depths failed: the last figures are kept (once an outage)",
    "report-failed": "a --workers child could not send its counts to the parent (debug)",
    # the consumer's published state (onceq._ops.heartbeat, read by onceq status)
    "heartbeat-failed": "the consumer's state could not be written to the ledger: retried",
    "heartbeat-back": "the consumer's state is written to the ledger again",
    "ledger-table-missing": "the ledger lacks an optional table its role may not create",
    "heartbeat-final-slow": "the final 'stopped' row took too long at the end of a run",
    "telemetry-close-failed": (
        "closing the metrics server or the heartbeat failed: the run's result holds"
    ),
    # the CLI's own lines, and lines of other libraries
    "error": "the command failed (the one line it exits with)",
    "new-ledger": "this run made a new ledger: it has seen no message before",
    "console-listening": "the console serves its page at this URL",
    "python-warning": "a Python warning (warnings module)",
    "log": "a line of another library (aiohttp, psycopg, asyncio …) or without an event",
}

# The flow the current task works for. Tasks copy the context they are created in, so
# a transport's callbacks (a lost connection) carry the flow of the consume path that
# opened it.
FLOW: contextvars.ContextVar[str | None] = contextvars.ContextVar("onceq_flow", default=None)

_format = "human"
# Fields of a record's `extra` a JSON line carries, besides the fixed ones.
EXTRA_FIELDS = ("msg_id", "reason", "attempt", "delay", "ref", "cause")
_messages = logging.getLogger("onceq.messages")


@contextlib.contextmanager
def flow_context(name: str | None) -> Iterator[None]:
    """Every record logged inside (and in tasks created inside) carries flow=name."""
    token = FLOW.set(name)
    try:
        yield
    finally:
        FLOW.reset(token)


class _FlowFilter(logging.Filter):
    """Stamps `flow` (from FLOW unless the call gave one) and `event` on every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "flow", None) is None:
            record.flow = FLOW.get()
        if not getattr(record, "event", None):
            record.event = "python-warning" if record.name == "py.warnings" else "log"
        return True


class RedactingFormatter(logging.Formatter):
    """Masks URL passwords and remembered secrets in every human line, ours or a library's."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, flow, event, message, …, exception.

    ASCII only (a lone surrogate from an undecodable file name cannot make the write
    fail on any stderr), '@' as \\u0040 (see the module's docstring), each field masked.
    """

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _iso(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "flow": getattr(record, "flow", None) or FLOW.get(),
            "event": getattr(record, "event", None) or "log",
        }
        for key in EXTRA_FIELDS:
            value = getattr(record, key, None)
            if value is not None and value != "":
                out[key] = value
        out["message"] = _message(record)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        masked = {k: _masked(v) for k, v in out.items()}
        return json.dumps(masked, ensure_ascii=True, default=str).replace("@", "\\u0040")


def _iso(created: float) -> str:
    """ISO 8601 in UTC with milliseconds: 2026-12-02T03:04:05.123Z."""
    whole = int(created)
    ms = int((created - whole) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{ms:03d}Z"


def _message(record: logging.LogRecord) -> str:
    # A call whose arguments do not fit its format would make logging print a
    # multi-line "--- Logging error ---" report outside the JSON: the raw parts instead.
    try:
        return record.getMessage()
    except Exception:
        return f"{record.msg} {record.args!r}"


def _masked(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    return redact_text(value if isinstance(value, str) else str(value))


# A library's line that repeats what onceq reports itself, by (logger, message start),
# and why it is dropped. psycopg: a pipeline or COPY block whose session was terminated
# (pg_terminate_backend, a failover) raised; closing it fails too and psycopg logs that
# second error with the object's repr (`<psycopg.AsyncPipeline [BAD] at 0x…>`). The
# first error is the one onceq reports ("ledger … connection lost", onceq._ledger.pg).
LIBRARY_NOISE: dict[tuple[str, str], str] = {
    ("psycopg", "error ignored terminating"): "the block's own error is reported by onceq",
}


def _library_noise(record: logging.LogRecord) -> bool:
    """False for a record of LIBRARY_NOISE (the handler then drops it)."""
    msg = str(record.msg)
    return not any(record.name == name and msg.startswith(start) for name, start in LIBRARY_NOISE)


def setup(fmt: str = "human", level: str = "warning") -> None:
    """One stderr handler in `fmt` ("human" | "json") at `level`, for every logger.

    aiormq and aio-pika log every failed connection attempt with a traceback; the
    command reports that failure itself in one line (and transport.py logs the loss
    and the reconnect once, with an event), so they are quietened to CRITICAL.
    """
    global _format
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format {fmt!r}: human or json")
    _format = fmt
    handler = logging.StreamHandler()
    handler.addFilter(_FlowFilter())
    handler.addFilter(_library_noise)
    handler.setFormatter(JsonFormatter() if fmt == "json" else RedactingFormatter(HUMAN))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(LEVELS[level])
    for noisy in ("aiormq", "aio_pika"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    # A Python warning is printed by the warnings module, not logged: in JSON it would
    # be a line no reader can parse; through logging it is one object like the rest.
    logging.captureWarnings(fmt == "json")


def json_mode() -> bool:
    """The command logs JSON: its own stderr lines (errors, notes) are JSON too."""
    return _format == "json"


def say(text: str, event: str, level: int = logging.ERROR) -> None:
    """A line the CLI itself writes on stderr: `onceq: TEXT`, or a JSON object in JSON mode."""
    if _format == "json":
        logging.getLogger("onceq.cli").log(level, text, extra={"event": event})
    else:
        sys.stderr.write(f"onceq: {text}\n")


def log_group(flow: str, group: Sequence[Any]) -> None:
    """One INFO line per settled entry that is not a plain success (see EVENTS).

    Called for every settled group of every flow, so it costs one level check when
    INFO is off; a plain success logs nothing (the counters and metrics count those).
    """
    if not _messages.isEnabledFor(logging.INFO):
        return
    for e in group:
        event = OUTCOME_EVENTS[outcome_of(e)]
        if event is None:
            continue
        d = e.delivery
        reason = e.reason
        if event == "duplicate" and e.fields.get("partner_duplicate"):
            reason = "partner-duplicate"
        extra: dict[str, Any] = {
            "flow": flow,
            "event": event,
            "msg_id": d.msg_id,
            "reason": reason,
            "attempt": e.attempt,
            "ref": d.ref,
        }
        text = f"{event} {d.msg_id if d.msg_id is not None else d.ref}"
        if reason:
            text += f": {reason}"
        if event == "retry":
            extra["delay"] = d.delay
            text += f" (attempt {e.attempt}, again in {d.delay:g}s)"
        elif event == "dead":
            text += f" (attempt {e.attempt})"
        _messages.info(text, extra=extra)


# Each onceq._core.stats outcome (what Stats and onceq_messages_total count) as its event:
# one table tells an entry's outcome, so a log line and a counter never disagree.
OUTCOME_EVENTS: dict[str, str | None] = {
    "processed": None,  # a plain success: counted, not logged
    "partner_duplicates": "duplicate",
    "duplicates": "duplicate",
    "recovered": "recovered",
    "requeued": "retry",
    "held": "held",
    "dead": "dead",
}
