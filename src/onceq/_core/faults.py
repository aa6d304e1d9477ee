"""Fault-injection points: let a test kill a real consumer at an exact moment.

The windows that matter most for "effectively once" (a record committed but its copy
not yet settled; a file claimed but not yet recorded) are microseconds wide, so a
kill from outside lands in them only by chance. Here the process kills itself there:

    ONCEQ_FAULT=POINT          the point at which the process SIGKILLs itself
    ONCEQ_FAULT_AFTER=N        fire the Nth time POINT is reached (default 1)

SIGKILL, not an exception or exit(): nothing of ours runs after it (no finally, no
atexit, no flush, no channel close), exactly like a power cut of the process or the
OOM killer. Only the kernel cleans up: file locks are dropped, the broker sees the
connection die and requeues what was unacked.

The engine's points (`ENGINE_POINTS`, reached by the consume loop for every source):

    before-commit               a group is decided, nothing of it is committed (every
                                copy must run again; the handler calls already made
                                are the at-least-once part)
    after-commit-before-settle  the group's records are durable, no copy of it is
                                settled. The next run must count them as recovered
                                and call nobody again
    mid-settle                  a source's settle has finished one copy of the group
                                (reached by the source: a dirq link, an ack), before
                                the rest

A source's own windows are its own: its `SourceType.fault_points` names them (dirq:
after-claim, after-retry-link, mid-replay; RabbitMQ: after-delay-publish; NATS:
after-dead-publish), and the registry `declare`s them when it loads the type. So a
new transport brings its points in its package and changes nothing here.

Refused early: ONCEQ_FAULT_AFTER is read at import; `check()` refuses a wrong one and an
ONCEQ_FAULT that no owner declares. The CLI's root and the registry (as each type loads)
ask it while the point is `pending()` — then every built-in type is loaded first — i.e.
before any command changes anything (a mistyped variable must not make a crash test pass
without ever crashing). Cheap when unset: the environment is read once, at import, and
`hit` is then a function that returns at once (one call per group; per file only for the
dirq points).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

from onceq.errors import UsageError

__all__ = ["ARMED", "ENGINE_POINTS", "check", "declare", "forget", "hit", "pending", "points"]

ENV_POINT = "ONCEQ_FAULT"
ENV_AFTER = "ONCEQ_FAULT_AFTER"
ENGINE = "engine"
ENGINE_POINTS: dict[str, str] = {
    "before-commit": "a group decided, nothing of it committed",
    "after-commit-before-settle": "a group's records durable, no copy of it settled",
    "mid-settle": "one copy of a group settled, the rest not yet",
}
# point -> the owner that declared it ("engine" or a source kind)
_owners: dict[str, str] = dict.fromkeys(ENGINE_POINTS, ENGINE)


def declare(owner: str, table: Mapping[str, str]) -> None:
    """Add `owner`'s points (name -> the window it marks). A name is one owner's: two
    sources declaring the same name would make one test kill the other's process."""
    for name in table:
        held = _owners.get(name, owner)
        if held != owner:
            raise ValueError(f"fault point {name!r} of {owner} is already {held}'s")
    _owners.update(dict.fromkeys(table, owner))


def forget(owner: str) -> None:
    """Drop `owner`'s points (a source type unregistered): a later type may declare
    the same names, and a mistyped ONCEQ_FAULT is no longer matched against them."""
    if owner == ENGINE:
        raise ValueError("the engine's fault points cannot be forgotten")
    for name in [n for n, o in _owners.items() if o == owner]:
        del _owners[name]


def points() -> dict[str, str]:
    """Every declared point and its owner, the engine's first."""
    return dict(_owners)


def pending() -> bool:
    """Whether the armed point is one no owner has declared yet (a source not loaded),
    or the variables are wrong: `check()` has something to say."""
    return _ERROR is not None or (_POINT is not None and _POINT not in _owners)


def check() -> None:
    """Refuse an ONCEQ_FAULT that names no declared point, or a wrong ONCEQ_FAULT_AFTER
    (one line, exit 2)."""
    if _ERROR is not None:
        raise _ERROR
    if _POINT is not None and _POINT not in _owners:
        raise UsageError(
            f"{ENV_POINT}: unknown fault point {_POINT!r} (one of {', '.join(_owners)})"
        )


def _armed() -> tuple[str | None, int, UsageError | None]:
    point = os.environ.get(ENV_POINT) or None
    if point is None:
        return None, 0, None
    raw = os.environ.get(ENV_AFTER) or "1"
    try:
        after = int(raw)
    except ValueError:
        after = 0
    if after < 1:
        # Kept, not raised: this module is imported by the CLI's root, outside the
        # handler that turns a UsageError into one line; `check()` raises it.
        error = UsageError(f"{ENV_AFTER}: {raw!r} is not a whole number of at least 1")
        return None, 0, error
    return point, after, None


_POINT, _AFTER, _ERROR = _armed()
_reached = 0


def _fire(point: str) -> None:
    global _reached
    if point != _POINT:
        return
    _reached += 1
    if _reached >= _AFTER:
        os.kill(os.getpid(), signal.SIGKILL)


def _off(point: str) -> None:
    """No point armed: nothing to count, nothing to compare."""


# Chosen once: the hot loops call `faults.hit(...)` and pay one empty call when unset;
# a loop that runs per message may test `ARMED` instead and make no call at all.
hit = _fire if _POINT is not None else _off
ARMED = _POINT is not None
