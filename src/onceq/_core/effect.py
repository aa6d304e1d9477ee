"""What a flow does with a message besides recording it: the effect contracts.

A flow's *call* effect runs before the ledger commit (an HTTP request, a Python
function); its *SQL* effect runs inside the ledger's own transaction (the inbox
pattern), so the business rows and the dedup row commit together or not at all.

`PythonEffect` runs a user's function as the call effect; `load_callable` finds it
from `package.module:function`. `Reject` and `Retry` are how a user's function says
what happened: returning is success, `Reject` is dead at once, `Retry` (or any other
exception) is transient; `Retry("why", after=30)` also asks for a wait of 30 s or more.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from onceq._core.logs import FLOW
from onceq._core.outcome import Outcome
from onceq._core.retry import RETRY_AFTER_CAP, parse_duration
from onceq._core.transport import REJECTED, SUCCESS, TRANSIENT
from onceq.errors import UsageError, redact_text

DETAIL_MAX = 200  # failure rows stay short
log = logging.getLogger("onceq.effect")  # the name in every log line: kept across moves
# The line an effect's exception is logged with: what it is, and what becomes of it.
RAISED_EVENTS = {"internal-error": "handler-failed", "config-error": "config-error"}


class Reject(Exception):
    """The message can never succeed: dead-letter it at once."""


class Retry(Exception):
    """The message may succeed later: a transient failure.

    `after` (seconds, or a duration such as "30s") is the least wait before the next
    try, as a partner's Retry-After: the retry policy picks the first delayed tier at
    least that long (an immediate retry is skipped). Capped at one day.
    """

    def __init__(self, *args: object, after: float | str | None = None) -> None:
        super().__init__(*args)
        self.after: float | None = None
        if after is not None:
            # A bad value is the caller's bug, raised where it is made (a ValueError in
            # a handler is then that message's internal-error, never the run's).
            try:
                seconds = parse_duration(after, "Retry after")
            except UsageError as exc:
                raise ValueError(str(exc)) from None
            self.after = min(seconds, RETRY_AFTER_CAP) or None


@dataclass(frozen=True)
class SqlEffect:
    """Business rows written in the ledger's transaction, once per message.

    `function(tx, doc)` runs for each message that takes effect, inside the open
    transaction (`tx.execute(sql, params)`); it must not commit or roll back. `tx` is
    the ledger's own connection: an `sqlite3.Connection` (`?` or `:name` parameters)
    on an SQLite ledger, a `psycopg.Connection` (`%s` or `%(name)s`) on PostgreSQL.
    `setup` (DDL) runs once when the ledger opens; `setup_postgresql`, when given, runs
    instead of it on a PostgreSQL ledger (the presets' `processed` table, whose
    0.1.0 DDL is SQLite's). `bulk(tx, entries)` is the presets' one-statement-per-group
    form.
    """

    function: Callable[[Any, dict[str, Any]], None] | None = None
    setup: str | None = None
    bulk: Callable[[Any, list[Any]], None] | None = None
    setup_postgresql: str | None = None


class PythonEffect:
    """A user's function, sync or async, given the decoded message (`doc`, a dict).

    Returning is success; `Reject` is dead at once (reason `rejected`); `Retry` is
    transient (`retry`); any other exception is transient (`internal-error`, the
    detail its type and message), so a bug in a handler is retried, then
    dead-lettered, and never takes the run down. A sync function runs in a worker
    thread (`asyncio.to_thread`): a blocking call in it must not stall the loop that
    settles every other message.
    """

    def __init__(self, function: Callable[[dict[str, Any]], Any]) -> None:
        if not callable(function):
            raise UsageError(f"python effect: {function!r} is not callable")
        self.function = function
        self._is_async = _is_async(function)

    def __repr__(self) -> str:
        name = getattr(self.function, "__qualname__", None) or repr(self.function)
        return f"PythonEffect({getattr(self.function, '__module__', '?')}:{name})"

    async def __call__(self, delivery: Any, fields: dict[str, Any]) -> Outcome:
        doc = fields.get("doc", {})
        try:
            if self._is_async:
                await self.function(doc)
            else:
                result = await asyncio.to_thread(self.function, doc)
                if inspect.isawaitable(result):  # a sync wrapper that hands back a coroutine
                    await result
        except asyncio.CancelledError:
            raise
        except Reject as exc:
            return Outcome(REJECTED, "rejected", _short(str(exc)))
        except Retry as exc:
            return Outcome(TRANSIENT, "retry", _short(str(exc)), retry_after=exc.after)
        except Exception as exc:  # a bug in the user's function is that message's, not the run's
            return Outcome(TRANSIENT, "internal-error", _short(f"{type(exc).__name__}: {exc}"))
        return Outcome(SUCCESS, fields=fields)

    async def aclose(self) -> None:
        """Nothing to close (the same shape as HttpEffect's)."""


def effect_raised(
    delivery: Any,
    exc: BaseException,
    *,
    config: bool = False,
    mask: Callable[[str], str] | None = None,
) -> Outcome:
    """An exception out of an effect: its Outcome, and one ERROR line — never a traceback.

    `config`: raised while the request was built from the flow's own configuration
    (aiohttp's ValueError or TypeError, something `onceq check` did not catch): every
    message would fail the same way, so retrying is pointless and it is dead at once
    (reason `config-error`), not retried for 13 minutes. Otherwise a bug in the
    effect (or in onceq): a transient `internal-error`, as a user's function's
    exception is. The line names the flow, the message, the exception's type and
    masked message; the traceback is logged at DEBUG (`--log-level debug`), and the
    failure's detail in the ledger is the type and the masked message (`mask`: the
    effect's own masking, e.g. of its header values; by default onceq._core.redact's).
    """
    what = (mask or _short)(f"{type(exc).__name__}: {exc}")
    reason = "config-error" if config else "internal-error"
    msg = delivery.msg_id if delivery.msg_id is not None else delivery.ref
    then = (
        "dead at once as config-error: fix the flow (onceq check), then replay it"
        if config
        else "a bug: retried as internal-error"
    )
    log.error(
        "flow %s: message %s: the effect raised %s; %s (the traceback at --log-level debug)",
        FLOW.get() or "-", msg, what, then,
        extra={"event": RAISED_EVENTS[reason], "msg_id": delivery.msg_id, "reason": reason},
    )  # fmt: skip
    log.debug(
        "the traceback of message %s", msg, exc_info=exc, extra={"event": RAISED_EVENTS[reason]}
    )
    return Outcome(REJECTED if config else TRANSIENT, reason, what)


def _is_async(function: Any) -> bool:
    target = function
    while isinstance(target, functools.partial):
        target = target.func
    if inspect.iscoroutinefunction(target):
        return True
    call = getattr(target, "__call__", None)  # noqa: B004 - an object with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def _short(text: str) -> str:
    return redact_text(" ".join(text.split())[:DETAIL_MAX])


def load_callable(spec: str) -> Callable[..., Any]:
    """The callable named `package.module:function` (or `module:Class.method`).

    Every failure is one UsageError naming the string: no colon, a module that does
    not import (and why), a missing attribute, something that is not callable.
    """
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise UsageError(f"{spec!r}: not module:function (one colon)")
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageError(f"{spec}: not module:function (both parts needed)")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise UsageError(f"{spec}: no module named {exc.name}") from None
        raise UsageError(f"{spec}: importing {module_name} failed: {_why(exc)}") from None
    except Exception as exc:  # the user's module raised while importing (a SyntaxError too)
        raise UsageError(f"{spec}: importing {module_name} failed: {_why(exc)}") from None
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UsageError(f"{spec}: {module_name} has no attribute {attr}") from None
    if not callable(target):
        raise UsageError(f"{spec}: {attr} is a {type(target).__name__}, not callable")
    function: Callable[..., Any] = target
    return function


def _why(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:DETAIL_MAX]
