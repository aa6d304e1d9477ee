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
# a stop signal that comes while it starts (onceq.early), instead of dying with 143.
from onceq.early import catch_for_command as _catch_early

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
    "Flow": "onceq.flow",
    "DirSource": "onceq.flow",
    "RabbitSource": "onceq.flow",
    "MessageSpec": "onceq.message",
    "HttpEffect": "onceq.http_effect",
    "StatusMap": "onceq.http_effect",
    "PythonEffect": "onceq.effect",
    "SqlEffect": "onceq.effect",
    "Reject": "onceq.effect",
    "Retry": "onceq.effect",
    "RetryPolicy": "onceq.retry",
    "BreakerPolicy": "onceq.retry",
    "GuardPolicy": "onceq.misconfig",
    "run": "onceq.runner",
    "run_async": "onceq.runner",
    "load_flows": "onceq.flowfile",
    # testing a flow, and the loop underneath
    "MemoryTransport": "onceq.memory",
    "Consumer": "onceq.consumer",
    "Outcome": "onceq.consumer",
    "Stats": "onceq.consumer",
    "Ledger": "onceq.ledger",
    "Delivery": "onceq.transport",
    "Kind": "onceq.transport",
    "Settle": "onceq.transport",
    "decide": "onceq.transport",
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
    from onceq.consumer import Consumer, Outcome, Stats
    from onceq.effect import PythonEffect, Reject, Retry, SqlEffect
    from onceq.flow import DirSource, Flow, RabbitSource
    from onceq.flowfile import load_flows
    from onceq.http_effect import HttpEffect, StatusMap
    from onceq.ledger import Ledger
    from onceq.memory import MemoryTransport
    from onceq.message import MessageSpec
    from onceq.misconfig import GuardPolicy
    from onceq.retry import BreakerPolicy, RetryPolicy
    from onceq.runner import run, run_async
    from onceq.transport import Delivery, Kind, Settle, decide


def _version() -> str:
    """The installed distribution's version: pyproject.toml is the one place it is set."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("onceq")
    except PackageNotFoundError:  # imported from a source tree that was never installed
        return "0+unknown"


__version__ = _version()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # once: later lookups do not come back here
        return value
    raise AttributeError(f"module 'onceq' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names too, though most are not imported yet (tab completion, dir())."""
    return sorted({*globals(), *__all__})
