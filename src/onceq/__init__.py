"""onceq: consume messages effectively once.

At-least-once delivery plus a ledger whose primary key refuses the second copy,
written in the same transaction as the business effect. A *flow* (a source, a
message spec, an effect) is what a user defines; `onceq.run` runs flows, and every
transport goes through the one consume loop (`onceq.Consumer`). docs/api.md is the
guide to the names below.

The public names are exactly `__all__` (tests/unit/test_public_api.py fixes the
list): anything else under `onceq.` may change without notice.
"""

# ruff: noqa: E402  (the early catch below comes before every other import)
from __future__ import annotations

# First, before any other import: the `onceq run/mq consume/dirq consume` command keeps
# a stop signal that comes while it starts (onceq._core.early), instead of dying with 143.
from onceq._core.early import catch_for_command as _catch_early

_catch_early()

import importlib
from typing import TYPE_CHECKING, Any

from onceq.errors import (
    AllFailed,
    BadMessage,
    BrokerUnavailable,
    Conflict,
    LedgerError,
    Misconfigured,
    NotFound,
    OnceqError,
    QueueError,
    Unroutable,
    UsageError,
)

# Imported on first use: `onceq dirq lag` and `--help` must start without sqlite3
# and asyncio, since a short command's time is mostly start-up.
_LAZY = {
    # a flow and how it runs
    "Flow": "onceq._flows.flow",
    "DirSource": "onceq._sources.dirq.plugin",
    "RabbitSource": "onceq._sources.amqp.plugin",
    "NatsSource": "onceq._sources.nats.plugin",
    "MessageSpec": "onceq._core.message",
    "HttpEffect": "onceq._effects.http",
    "StatusMap": "onceq._effects.http",
    "PythonEffect": "onceq._core.effect",
    "SqlEffect": "onceq._core.effect",
    "Reject": "onceq._core.effect",
    "Retry": "onceq._core.effect",
    "RetryPolicy": "onceq._core.retry",
    "BreakerPolicy": "onceq._core.retry",
    "GuardPolicy": "onceq._core.misconfig",
    "run": "onceq._flows.runner",
    "run_async": "onceq._flows.runner",
    "load_flows": "onceq._flows.file",
    # testing a flow, and the loop underneath
    "MemoryTransport": "onceq._sources.memory",
    "Consumer": "onceq._core.consumer",
    "Outcome": "onceq._core.consumer",
    "Stats": "onceq._core.consumer",
    "Ledger": "onceq._ledger.sqlite",
    "Delivery": "onceq._core.transport",
    "Kind": "onceq._core.transport",
    "Settle": "onceq._core.transport",
    "decide": "onceq._core.transport",
}

# Written out (not built from _LAZY): a linter and a reader see the public names here.
__all__ = [
    "AllFailed",
    "BadMessage",
    "BreakerPolicy",
    "BrokerUnavailable",
    "Conflict",
    "Consumer",
    "Delivery",
    "DirSource",
    "Flow",
    "GuardPolicy",
    "HttpEffect",
    "Kind",
    "Ledger",
    "LedgerError",
    "MemoryTransport",
    "MessageSpec",
    "Misconfigured",
    "NatsSource",
    "NotFound",
    "OnceqError",
    "Outcome",
    "PythonEffect",
    "QueueError",
    "RabbitSource",
    "Reject",
    "Retry",
    "RetryPolicy",
    "Settle",
    "SqlEffect",
    "Stats",
    "StatusMap",
    "Unroutable",
    "UsageError",
    "__version__",
    "decide",
    "load_flows",
    "run",
    "run_async",
]

if TYPE_CHECKING:  # what a type checker and an IDE see; at run time __getattr__ imports
    from onceq._core.consumer import Consumer, Outcome, Stats
    from onceq._core.effect import PythonEffect, Reject, Retry, SqlEffect
    from onceq._core.message import MessageSpec
    from onceq._core.misconfig import GuardPolicy
    from onceq._core.retry import BreakerPolicy, RetryPolicy
    from onceq._core.transport import Delivery, Kind, Settle, decide
    from onceq._effects.http import HttpEffect, StatusMap
    from onceq._flows.file import load_flows
    from onceq._flows.flow import Flow
    from onceq._flows.runner import run, run_async
    from onceq._ledger.sqlite import Ledger
    from onceq._sources.amqp.plugin import RabbitSource
    from onceq._sources.dirq.plugin import DirSource
    from onceq._sources.memory import MemoryTransport
    from onceq._sources.nats.plugin import NatsSource


def _version() -> str:
    """The installed distribution's version: pyproject.toml is the one place it is set."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("onceq")
    except PackageNotFoundError:  # imported from a source tree that was never installed
        return "0+unknown"


if TYPE_CHECKING:
    __version__: str


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # once: later lookups do not come back here
        return value
    if name == "__version__":
        # Read on first use: importlib.metadata (and the email package under it) is a
        # good part of every command's start-up, and only --version and a caller need it.
        globals()[name] = value = _version()
        return value
    raise AttributeError(f"module 'onceq' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names too, though most are not imported yet (tab completion, dir())."""
    return sorted({*globals(), *__all__})
