"""onceq: consume messages effectively once.

At-least-once delivery plus a ledger whose primary key refuses the second copy,
written in the same transaction as the business effect. Two transports share the
one consume loop (`onceq.consumer.Consumer`): a directory queue (`onceq.dirq`) and
RabbitMQ (`onceq.amqp`).
"""

from __future__ import annotations

import importlib
from typing import Any

from onceq.errors import OnceqError

# Imported on first use: `onceq dirq lag` and `--help` must start without sqlite3
# and asyncio, since a short command's time is mostly start-up.
_LAZY = {
    "Consumer": "onceq.consumer",
    "Outcome": "onceq.consumer",
    "Stats": "onceq.consumer",
    "Ledger": "onceq.ledger",
    "Delivery": "onceq.transport",
    "Kind": "onceq.transport",
    "Settle": "onceq.transport",
    "decide": "onceq.transport",
    "Flow": "onceq.flow",
    "DirSource": "onceq.flow",
    "RabbitSource": "onceq.flow",
    "run": "onceq.runner",
    "run_async": "onceq.runner",
    "load_flows": "onceq.flowfile",
}

__all__ = ["OnceqError", *_LAZY]


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
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'onceq' has no attribute {name!r}")
