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
# a stop signal that comes while it starts (onceq.core.early), instead of dying with 143.
from onceq.core.early import catch_for_command as _catch_early

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
    "Flow": "onceq.flows.flow",
    "DirSource": "onceq.sources.dirq.plugin",
    "RabbitSource": "onceq.sources.amqp.plugin",
    "MessageSpec": "onceq.core.message",
    "HttpEffect": "onceq.effects.http",
    "StatusMap": "onceq.effects.http",
    "PythonEffect": "onceq.core.effect",
    "SqlEffect": "onceq.core.effect",
    "Reject": "onceq.core.effect",
    "Retry": "onceq.core.effect",
    "RetryPolicy": "onceq.core.retry",
    "BreakerPolicy": "onceq.core.retry",
    "GuardPolicy": "onceq.core.misconfig",
    "run": "onceq.flows.runner",
    "run_async": "onceq.flows.runner",
    "load_flows": "onceq.flows.file",
    # testing a flow, and the loop underneath
    "MemoryTransport": "onceq.sources.memory",
    "Consumer": "onceq.core.consumer",
    "Outcome": "onceq.core.consumer",
    "Stats": "onceq.core.consumer",
    "Ledger": "onceq.ledger.sqlite",
    "Delivery": "onceq.core.transport",
    "Kind": "onceq.core.transport",
    "Settle": "onceq.core.transport",
    "decide": "onceq.core.transport",
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
    from onceq.core.consumer import Consumer, Outcome, Stats
    from onceq.core.effect import PythonEffect, Reject, Retry, SqlEffect
    from onceq.core.message import MessageSpec
    from onceq.core.misconfig import GuardPolicy
    from onceq.core.retry import BreakerPolicy, RetryPolicy
    from onceq.core.transport import Delivery, Kind, Settle, decide
    from onceq.effects.http import HttpEffect, StatusMap
    from onceq.flows.file import load_flows
    from onceq.flows.flow import Flow
    from onceq.flows.runner import run, run_async
    from onceq.ledger.sqlite import Ledger
    from onceq.sources.amqp.plugin import RabbitSource
    from onceq.sources.dirq.plugin import DirSource
    from onceq.sources.memory import MemoryTransport


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
