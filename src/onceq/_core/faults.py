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

Points (each named where it is reached):

    before-commit               consume loop: a group is decided, nothing of it is
                                committed (every copy must run again; the handler
                                calls already made are the at-least-once part)
    after-commit-before-settle  consume loop: the group's records are durable, no
                                copy of it is settled (dirq: files still in
                                processing/; AMQP: still unacked). The next run must
                                count them as recovered and call nobody again
    mid-settle                  dirq: after a file of the group is linked into
                                done/ or error/, before the rest and before any
                                unlink (the file is in two places); AMQP: after one
                                ack/reject of the group (acks are sent one by one),
                                before the rest
    after-claim                 dirq: a file was renamed into processing/w-ID/ and
                                not yet read (recovery by the next consumer)
    after-retry-link            dirq: a transient failure is committed and its file,
                                its due time set, linked into retry/, not yet
                                fsynced nor unlinked from processing/ (two names:
                                the next consumer must drop the claim, not run it
                                beside the copy that retry/ hands out)
    mid-replay                  dirq replay --all/--reason: a file is linked into
                                inbox/ and still in error/ (its replay recorded)
    after-delay-publish         AMQP: the copies of a group's DELAY settles are
                                confirmed in their retry queues, no original is
                                acked yet (each message exists twice: the original
                                comes back, nothing is lost)

Cheap when unset: the environment is read once, at import, and `hit` is then a
function that returns at once (one call per group; per file only for the dirq
points). A value that names no point is refused at import, so a mistyped variable
cannot make a crash test pass without ever crashing.
"""

from __future__ import annotations

import os
import signal

from onceq.errors import UsageError

ENV_POINT = "ONCEQ_FAULT"
ENV_AFTER = "ONCEQ_FAULT_AFTER"
POINTS = (
    "before-commit",
    "after-commit-before-settle",
    "mid-settle",
    "after-claim",
    "after-retry-link",
    "mid-replay",
    "after-delay-publish",
)


def _armed() -> tuple[str | None, int]:
    point = os.environ.get(ENV_POINT) or None
    if point is None:
        return None, 0
    if point not in POINTS:
        raise UsageError(f"{ENV_POINT}: unknown fault point {point!r} (one of {', '.join(POINTS)})")
    raw = os.environ.get(ENV_AFTER) or "1"
    try:
        after = int(raw)
    except ValueError:
        after = 0
    if after < 1:
        raise UsageError(f"{ENV_AFTER}: {raw!r} is not a whole number of at least 1")
    return point, after


_POINT, _AFTER = _armed()
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


# Chosen once: the hot loops call `faults.hit(...)` and pay one empty call when unset.
hit = _fire if _POINT is not None else _off
