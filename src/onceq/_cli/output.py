"""Printing for the CLI: rich for people, plain JSON for machines, one-line errors."""

from __future__ import annotations

import json
import logging
import math
import sys
from typing import Any, TextIO

import click

from onceq._core.logs import json_mode, say
from onceq._core.stats import Stats
from onceq._core.summary import run_summary
from onceq._ledger.target import describe

_console = None
_err_console = None

# Width for output that is not a terminal. rich falls back to 80 columns there and
# word-wraps at it, which breaks a long path or a summary phrase across two lines: a
# reader that greps or parses line by line would then miss it. A file has no width.
UNBOUNDED = 1_000_000


def _settings(stream: TextIO) -> dict[str, Any]:
    if stream.isatty():
        return {}
    return {"soft_wrap": True, "width": UNBOUNDED}


def console() -> Any:
    """rich's Console, imported on first use so short commands start fast."""
    global _console
    if _console is None:
        from rich.console import Console

        _console = Console(highlight=False, **_settings(sys.stdout))
    return _console


def err_console() -> Any:
    global _err_console
    if _err_console is None:
        from rich.console import Console

        _err_console = Console(stderr=True, highlight=False, **_settings(sys.stderr))
    return _err_console


def emit_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def fail(message: str) -> None:
    """One line on stderr, no traceback, no markup interpretation (JSON with --log-format json)."""
    say(message, "error")


def print_run_summary(stats: Stats, head: str = "", tail: str = "") -> None:
    """`run_summary` on stdout; the all-failed line in bold red on a terminal."""
    from rich.text import Text

    out = console()
    for line in run_summary(stats, head, tail):
        style = "bold red" if line.startswith("every message failed") else ""
        # Text, not markup: a path or a reason is printed as it is, brackets and all.
        out.print(Text(line, style=style))


def note_new_ledger(path: object) -> None:
    """Say that this run made a new ledger: it has seen no message, so a queue it is put
    in front of is applied again. On stderr (stdout may be JSON), once per run."""
    # On a terminal a progress line may be drawn: start at column 0 on a clean line, so
    # the note is a line of its own (the progress line is redrawn below it).
    clear = "\r\x1b[2K" if sys.stderr.isatty() else ""
    # describe: a PostgreSQL ledger is named by its URL, shown without its password.
    where = describe(path if isinstance(path, str) else str(path))
    if json_mode():  # every stderr line of a JSON-logging run is a JSON object
        say(f"new ledger at {where}: no message seen before", "new-ledger", logging.WARNING)
        return
    sys.stderr.write(f"{clear}onceq: new ledger at {where}: no message seen before\n")


class Seconds(click.FloatRange):
    """A positive, finite number of seconds (FloatRange lets nan and inf through)."""

    name = "seconds"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return number
