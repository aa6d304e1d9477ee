"""A stop signal that comes before a consume loop exists is kept, not fatal.

`onceq run FILE` and every source's `consume` handle SIGINT/SIGTERM on their
event loop (onceq._core.stop.Stop), but a loop exists only after the imports, the flow
file, the telemetry port and asyncio's start: some tenths of a second in which a
signal's default action would end the process (143 from a shell) whatever the
documented rule says (a consumer that runs until stopped exits 0). So these commands
take the signals from onceq's first line (onceq/__init__.py calls `catch` when the
process is the `onceq` command) and the Stop that starts later replays what came.

Only signal, os and sys are imported here: this runs before anything else of onceq.
What is left is Python's own start (a few tens of ms before onceq's first line), in
which a signal still has its default action.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

__all__ = [
    "CONSUME_COMMANDS",
    "active",
    "catch",
    "catch_for_command",
    "command_consumes",
    "release",
    "take",
]

# The commands whose exit code a stop signal decides (README's exit-code table): `run`
# and every source's `consume` (`mq consume`, `dirq consume`, `nats consume` …). A
# rule, not a list of groups: a new source's consume command is caught without a
# change here.
CONSUME_COMMANDS = (("run",), ("*", "consume"))

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_pending: list[int] = []
_caught: list[int] = []  # the signals this module handles now


def command_consumes(argv: list[str]) -> bool:
    """True for `onceq run …` and `onceq GROUP consume …` (mq, dirq, nats …)."""
    words = [a for a in argv if not a.startswith("-")]
    return any(
        len(words) >= len(c) and all(w in ("*", x) for w, x in zip(c, words, strict=False))
        for c in CONSUME_COMMANDS
    )


def catch_for_command() -> None:
    """Catch early when this process is the `onceq` command running a consumer."""
    args = _command_args()
    if args is not None and command_consumes(args):
        catch()


def _command_args() -> list[str] | None:
    """The command's words when this process is `onceq …` or `python -m onceq …`.

    sys.orig_argv, not sys.argv: while `-m onceq` imports the package, argv[0] is
    still "-m", which any other `python -m tool` importing onceq would show too.
    """
    orig = list(getattr(sys, "orig_argv", []))
    if "-m" in orig:
        at = orig.index("-m")
        return orig[at + 2 :] if orig[at + 1 : at + 2] == ["onceq"] else None
    if sys.argv and os.path.basename(sys.argv[0]) == "onceq":
        return sys.argv[1:]
    return None


def catch() -> None:
    """Record SIGINT/SIGTERM from now on (an ignored one stays ignored)."""
    for s in _SIGNALS:
        if signal.getsignal(s) is signal.SIG_IGN:
            continue
        signal.signal(s, _record)
        if s not in _caught:
            _caught.append(s)


def active() -> bool:
    return bool(_caught)


def _record(signum: int, _frame: FrameType | None) -> None:
    if _pending:
        # A second signal before the loop: as the default handler would, end now
        # (nothing has been taken yet, or the next run recovers it).
        release()
        signal.raise_signal(signum)
        return
    _pending.append(signum)


def take() -> list[int]:
    """The signals that came before now (at most one), forgotten here."""
    got = list(_pending)
    _pending.clear()
    return got


def release() -> None:
    """Give the signals their default action back."""
    for s in _caught:
        signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
    _caught.clear()
