"""Printing for the CLI: rich for people, plain JSON for machines, one-line errors."""

from __future__ import annotations

import json
import sys
from typing import Any

_console = None
_err_console = None


def console() -> Any:
    """rich's Console, imported on first use so short commands start fast."""
    global _console
    if _console is None:
        from rich.console import Console

        _console = Console(highlight=False)
    return _console


def err_console() -> Any:
    global _err_console
    if _err_console is None:
        from rich.console import Console

        _err_console = Console(stderr=True, highlight=False)
    return _err_console


def emit_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def fail(message: str) -> None:
    """One line on stderr, no traceback, no markup interpretation."""
    sys.stderr.write(f"onceq: {message}\n")


def note_new_ledger(path: object) -> None:
    """Say that this run made a new ledger: it has seen no message, so a queue it is put
    in front of is applied again. On stderr (stdout may be JSON), once per run."""
    sys.stderr.write(f"onceq: new ledger at {path}: no message seen before\n")
