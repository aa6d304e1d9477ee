"""Printing for the CLI: rich for people, plain JSON for machines, one-line errors."""

from __future__ import annotations

import json
import logging
import sys
from typing import TYPE_CHECKING, Any, TextIO

import click

if TYPE_CHECKING:
    from onceq.core.consumer import Stats

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
    from onceq.core.logs import say

    say(message, "error")


def _by_reason(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def run_summary(stats: Stats, head: str = "", tail: str = "") -> list[str]:
    """The human summary of a consume run, in the words its JSON uses.

    Every count is `N key` with the very key `Stats.as_dict` gives it ("3 duplicates",
    "2 quarantined" for a directory queue, "2 dead" for a broker), so what a person
    reads and what a script parses say the same thing. A run in which nothing took
    effect gets a first line of its own: a count buried in the middle of a summary is
    how a wholly failed run passes for a finished one.
    """
    word = stats.dead_word
    dead = f"{stats.dead} {word}"
    if stats.reasons:
        dead += f" ({_by_reason(stats.reasons)})"
    parts = [
        f"{stats.received} received",
        f"{stats.processed} processed",
        f"{stats.duplicates} duplicates",
    ]
    if stats.partner_duplicates:  # only an HTTP effect with a duplicate status has them
        parts.append(f"{stats.partner_duplicates} partner_duplicates")
    parts.append(f"{stats.recovered} recovered")
    if stats.requeued:  # only a broker requeues; a directory queue would print "0" forever
        parts.append(f"{stats.requeued} requeued ({_by_reason(stats.requeued_reasons)})")
    parts.append(dead)
    lines = [head + ", ".join(parts) + tail]
    if stats.all_failed:
        lines.insert(0, f"every message failed: {dead}")
    return lines


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
    from onceq.ledger.target import describe

    clear = "\r\x1b[2K" if sys.stderr.isatty() else ""
    # describe: a PostgreSQL ledger is named by its URL, shown without its password.
    where = describe(path if isinstance(path, str) else str(path))
    from onceq.core.logs import json_mode, say

    if json_mode():  # every stderr line of a JSON-logging run is a JSON object
        say(f"new ledger at {where}: no message seen before", "new-ledger", logging.WARNING)
        return
    sys.stderr.write(f"{clear}onceq: new ledger at {where}: no message seen before\n")


class Seconds(click.FloatRange):
    """A positive, finite number of seconds (FloatRange lets nan and inf through)."""

    name = "seconds"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        import math

        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return number
