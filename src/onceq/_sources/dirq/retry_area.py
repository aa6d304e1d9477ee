"""QDIR/retry/: files waiting for a retry, each due at its own modification time.

    QDIR/processing/w-ID/NAME  --(transient failure recorded)-->  QDIR/retry/NAME
      mtime := due time (now + the tier's delay; now for an immediate retry)
    QDIR/retry/NAME (mtime <= now)  --rename-->  QDIR/processing/w-ID/NAME  (claimed)

Why the mtime: the due time travels with the file itself, in the same inode, so no
second record (a side file, a database row) can disagree with the folder after a
crash. It is set on the claimed file BEFORE the link into retry/, so there is no
instant at which retry/ holds the file without its due time.

Why a folder and not the inbox: a file waiting 30 s must not be claimed, read and
put back by every sweep of every consumer; retry/ is looked at in due order, the
inbox in name order, and `lag` can say how many wait for a retry.

retry/ is created the first time a file has to wait (queues made before it, like
the exercise's, have none and need none).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from pathlib import Path

from onceq._sources.dirq.files import fsync_dir, is_message_name, open_dir
from onceq._sources.dirq.queue import RETRY

log = logging.getLogger("onceq.dirq.retry_area")  # the name in every log line: kept across moves


def open_retry(root: Path, create: bool) -> int | None:
    """An open descriptor of root/retry/, created (durably) when `create`; else None if absent."""
    path = root / RETRY
    if create:
        try:
            path.mkdir()
        except FileExistsError:
            pass
        else:
            # The folder's own name must survive a power cut before any file is
            # linked into it (a file whose only name is in a lost folder is lost).
            fsync_dir(root)
    try:
        return open_dir(path)
    except FileNotFoundError:
        return None


def set_due(name: str, dir_fd: int, due: float) -> None:
    """Make `due` (epoch seconds) the modification time of the claimed file `name`.

    Setting explicit times needs the file's owner (or root). A file some other user
    produced keeps its old mtime, which is in the past: it is then due at once, i.e.
    an immediate retry. That wastes the delay, never the message: its attempts are
    counted in the ledger, so it still ends in error/ after the policy's last one.
    """
    ns = int(due * 1e9)
    try:
        os.utime(name, ns=(ns, ns), dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        log.warning(
            "%s: cannot set its retry time (%s); it is due at once",
            name,
            exc.strerror,
            extra={"event": "retry-time-unset"},
        )


def scan(retry_fd: int, now: float) -> tuple[list[str], float]:
    """(names due now, oldest due first; the next future due time or +inf)."""
    due: list[tuple[int, str]] = []
    next_due = math.inf
    now_ns = int(now * 1e9)
    with os.scandir(retry_fd) as it:
        for e in it:
            if not is_message_name(e.name):
                continue
            try:
                m = e.stat(follow_symlinks=False).st_mtime_ns
            except FileNotFoundError:
                continue  # another consumer claimed it meanwhile
            if m <= now_ns:
                due.append((m, e.name))
            else:
                next_due = min(next_due, m / 1e9)
    due.sort()
    return [n for _, n in due], next_due


def waiting(root: Path) -> int | None:
    """Message files in root/retry/ (None when the queue has no retry/ folder)."""
    try:
        with os.scandir(root / RETRY) as it:
            return sum(1 for e in it if is_message_name(e.name))
    except FileNotFoundError:
        return None


def next_due_in(root: Path) -> float | None:
    """Seconds until the earliest file of root/retry/ is due (0 if one is); None if none."""
    fd = open_retry(root, create=False)
    if fd is None:
        return None
    try:
        now = time.time()
        due, nxt = scan(fd, now)
    finally:
        os.close(fd)
    if due:
        return 0.0
    return None if math.isinf(nxt) else max(nxt - now, 0.0)


def moved_on(root: Path, dead_claim: Path, own: Path) -> Path | None:
    """Where else a dead consumer's claim lives, if its move out had begun; else None.

    A consumer moves a claim by link, then unlink. Killed between the two, it leaves
    the same file (one inode) in its claim folder and in the destination. For done/
    and error/ the next consumer just runs it again (the ledger recognises it). But
    retry/ and inbox/ are claimed from: running the dead claim too would be a second
    copy of one message in flight, maybe in two processes at once. So a dead claim
    whose inode is also in retry/, inbox/, or another consumer's claim folder (it
    was claimed from retry/ meanwhile) has finished moving, and is only dropped.

    Only a positive match counts: a file a producer hard-linked into the inbox has
    two names from the start, and the other one is outside the queue.
    """
    try:
        st = os.lstat(dead_claim)
    except FileNotFoundError:
        return None
    if st.st_nlink < 2:
        return None
    name = dead_claim.name
    folders = [root / RETRY, root / "inbox"]
    with contextlib.suppress(FileNotFoundError), os.scandir(root / "processing") as it:
        folders += [
            Path(e.path)
            for e in it
            if e.is_dir(follow_symlinks=False) and Path(e.path) not in (dead_claim.parent, own)
        ]
    for folder in folders:
        try:
            names = os.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for n in names:
            # link_no_clobber names a clash NAME.1, NAME.2 …; a claim keeps its name.
            if n != name and not n.startswith(name + "."):
                continue
            with contextlib.suppress(FileNotFoundError):
                other = os.lstat(folder / n)
                if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
                    return folder / n
    return None
