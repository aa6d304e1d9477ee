"""File moves a queue can trust: atomic writes, no-clobber moves, durable folders.

rename(2) silently replaces its target, so nothing here moves a message with it
except into a folder that only its owner writes. Moves between shared folders go
by link + unlink: EEXIST refuses to replace a file, and a crash between the two
leaves the same inode in both places, which the next attempt recognises. A
consumer's moves after a commit run in a thread of their own (`Mover`).
"""

from __future__ import annotations

import concurrent.futures
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from onceq._core.transport import ACK, DEAD, DELAY, RELEASE, REQUEUE
from onceq.errors import QueueError, UsageError

# Where a settled file goes. The directory queue's own retry: a transient failure
# waits in retry/ (never back in the inbox, where it would be claimed again at once:
# the poison loop); what the breaker held untried goes back to the inbox as it was.
DEST = {
    ACK: "done",
    DEAD: "error",
    DELAY: "retry",
    REQUEUE: "retry",
    RELEASE: "inbox",
}


def is_message_name(name: str) -> bool:
    """Dotfiles and *.tmp are a producer's partial writes, not messages (yet)."""
    return not name.startswith(".") and not name.endswith(".tmp")


def check_name(name: str) -> str:
    """A plain file name inside one folder, or UsageError."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise UsageError(f"{name!r}: not a plain file name")
    return name


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(folder: Path, name: str, data: bytes) -> Path:
    """Write folder/name the producer's way: .name.tmp, fsync, rename (never half a file)."""
    tmp = folder / f".{name}.{secrets.token_hex(4)}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, folder / name)
    return folder / name


def move_no_clobber(
    src: str | Path,
    dst: str | Path,
    *,
    src_dir_fd: int | None = None,
    dst_dir_fd: int | None = None,
) -> Path:
    """Move src to dst without ever replacing dst; returns where it went.

    rename(2) silently replaces its target, so a file goes by link + unlink. A
    crash between the two leaves the same inode in both places; the next attempt
    finds dst identical and only drops src. A different file already at dst makes
    the move go to dst.1, dst.2 …: a queue never loses a message to a name clash.
    With `src_dir_fd` / `dst_dir_fd`, src / dst are names inside those folders.
    """
    target, linked = link_no_clobber(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
    if linked:
        os.unlink(src, dir_fd=src_dir_fd)
    return target


def link_no_clobber(
    src: str | Path,
    dst: str | Path,
    *,
    src_dir_fd: int | None = None,
    dst_dir_fd: int | None = None,
) -> tuple[Path, bool]:
    """The first half of `move_no_clobber`: link src at dst (or dst.1 …).

    Returns (where it went, whether src still has to be unlinked). A folder is
    moved whole by rename at once (link(2) refuses folders), so it has nothing left
    to unlink.
    """
    # Plain strings, open folder descriptors (no path walk per call), and link(2)
    # tried first with no stat before it: this runs once per message on the hot
    # path, and link itself is the existence check.
    src, dst = os.fspath(src), os.fspath(dst)
    n, target = 0, dst
    while True:
        try:
            os.link(
                src, target, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd, follow_symlinks=False
            )
            return Path(target), True
        except FileExistsError:
            if _same_file(src, target, src_dir_fd, dst_dir_fd):
                return Path(target), True  # a crash fell between link and unlink
            n += 1
            target = f"{dst}.{n}"
        except PermissionError:
            # link(2) refuses a directory (EPERM). A folder someone dropped in the
            # queue moves whole, by rename to a name that is free: it sits in our
            # private processing folder, so nobody races us for the source.
            if not stat.S_ISDIR(os.lstat(src, dir_fd=src_dir_fd).st_mode):
                raise
            target = _free_name(dst, dst_dir_fd)
            os.rename(src, target, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
            return Path(target), False


def _exists(name: str, dir_fd: int | None) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def _free_name(dst: str, dir_fd: int | None = None) -> str:
    n, target = 0, dst
    while _exists(target, dir_fd):
        n += 1
        target = f"{dst}.{n}"
    return target


def _same_file(a: str, b: str, a_fd: int | None = None, b_fd: int | None = None) -> bool:
    try:
        sa, sb = os.lstat(a, dir_fd=a_fd), os.lstat(b, dir_fd=b_fd)
    except FileNotFoundError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def open_dir(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def move_error(folder: Path, ref: str, exc: OSError) -> QueueError:
    """A consumer's move after a commit failed: the run stops with this error.

    The records are durable and the claims stay in the consumer's folder: the next
    run takes them over and finishes these moves (nothing lost, nothing applied
    twice). The run stops: every later move would fail alike.
    """
    return QueueError(
        f"{folder}: cannot move {ref} there: {exc.strerror};"
        " the claimed files wait in processing/ for the next run"
    )


# --- the moves after a commit ------------------------------------------------------
#
# A consumer's moves after the commit, run behind the committer (`Mover`).
#
# The consume loop's committer commits a group, then settles it, then commits the next
# one: with the moves (link every file, fsync the folders, unlink) awaited inside the
# settle, the commit of group N+1 waited for the moves of group N, and both wait on the
# disk. `Worker.settle` hands a group's moves to a `Mover` instead and returns; the
# committer goes on to the next commit while they run.
#
# Why this keeps every guarantee:
#
# - a group reaches the mover only through `settle`, which the loop calls after THAT
#   group's commit is durable: no file leaves processing/ before its own record is
#   durable, whatever runs beside it;
# - one thread, one group at a time, in the order committed, and `Worker.settle` waits
#   for the previous group's moves first: at most one group is moving while the next commits;
# - until its moves are done a file keeps its name in the worker's `_held` (the
#   consumer may claim no file of that name) and stays in processing/: a crash then
#   leaves a claim whose record is durable — the state recovery already exists for
#   (the next consumer finds the row and only finishes the move), or a file linked and
#   not yet unlinked (likewise);
# - a failed move is raised by the next settle, by `Worker.moved` (a run's end) or, when
#   nothing else will ask, by `Worker.deliveries` or `Worker.close`: the run stops with
#   it, as before, its claims left for the next run.


class Mover:
    """Runs `move(group)` in a thread of its own, one group at a time, in order.

    Only threads here (`dirq lag` and `dirq status` import this module, and stay light:
    no event loop); `Worker.settle` and `Worker.moved` await it.
    """

    def __init__(self, move: Callable[[Any], float]) -> None:
        self._move = move
        self._pool = concurrent.futures.ThreadPoolExecutor(1, "onceq-dirq-moves")
        self.last: concurrent.futures.Future[float] | None = None  # the latest group's
        self._raised = False  # a failure is raised once, by whoever asks first

    def submit(self, group: Any, done: Callable[[float | None], None]) -> None:
        """Move `group` after the groups before it; `done(earliest due, or None when
        the moves failed)` is called in the mover's thread."""
        self.last = self._pool.submit(self._move, group)
        self.last.add_done_callback(
            lambda f: done(None if f.cancelled() or f.exception() else f.result())
        )

    def raise_failure(self) -> None:
        """Raise the error of the last moves, once they have ended with one."""
        failure = self._failure()
        if failure is not None:
            self._raised = True
            raise failure

    def _failure(self) -> BaseException | None:
        last = self.last
        if last is None or not last.done() or last.cancelled():
            return None
        return last.exception()

    def close(self) -> BaseException | None:
        """Wait for the moves under way (the folders they use are closed next); their
        error, if they failed and nobody has raised it yet."""
        self._pool.shutdown(wait=True)
        return None if self._raised else self._failure()
