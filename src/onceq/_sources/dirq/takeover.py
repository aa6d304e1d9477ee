"""A starting consumer takes over the claims of dead ones, and removes dead nurseries.

Each consumer claims into processing/w-ID/ and holds an exclusive flock on its
.lock for as long as it lives (onceq._sources.dirq.worker). The lock, not the age of a
file, says whether a claimed file has an owner: the kernel drops it when the process
dies, however it dies (kill -9 included). A consumer that starts takes over every
processing/w-*/ whose lock it can get, and runs those files again; the ledger
recognises the ones that were already committed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

from onceq._sources.dirq import retry_area
from onceq._sources.dirq.files import is_message_name

__all__ = ["LOCK", "NURSERY", "UNBORN_GRACE_S", "recover", "sweep_nurseries"]

LOCK = ".lock"
# A consumer builds its claim folder as QDIR/.w-ID.new and moves it into processing/
# within microseconds; a nursery this old was left by a kill.
NURSERY = ".new"
UNBORN_GRACE_S = 60.0

# The consumer's claim: rename(2) a file (path, name) into its own folder; False when
# another consumer won it.
Claim = Callable[[Path, str], bool]


def recover(root: Path, processing: Path, own: Path, claim: Claim) -> list[str]:
    """Take over the claims of every dead consumer; returns the names taken."""
    taken: list[str] = []
    with os.scandir(processing) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        path = Path(e.path)
        if path == own or e.name.startswith("."):
            continue  # ours, or not a claim (a producer's or a user's dotfile)
        if e.is_dir(follow_symlinks=False):
            taken += _take_over(root, path, own, claim)
        elif is_message_name(e.name) and claim(path, e.name):
            # A loose file (an older consumer, a hand move): claimed like an inbox file.
            taken.append(e.name)
    return taken


def _take_over(root: Path, dead: Path, own: Path, claim: Claim) -> list[str]:
    try:
        fd = os.open(dead / LOCK, os.O_RDWR)
    except (FileNotFoundError, NotADirectoryError):
        fd = None  # a stray folder without a lock: nobody can own it
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return []  # its owner is alive
        try:
            names = sorted(os.listdir(dead))
        except FileNotFoundError:
            # Its owner removed it as it ended (between our scan and here), or another
            # starting consumer took it over first: a folder is only ever removed
            # empty, so there is nothing to take.
            return []
        taken = [
            n
            for n in names
            if n != LOCK and not finish_move(root, dead / n, own) and claim(dead / n, n)
        ]
        with contextlib.suppress(OSError):
            if fd is not None:
                os.unlink(dead / LOCK)
            os.rmdir(dead)
        return taken
    finally:
        if fd is not None:
            os.close(fd)


def finish_move(root: Path, claim: Path, own: Path) -> bool:
    """Drop a dead claim already linked into retry/ or inbox/ (True), see retry_area.

    Running it would put a second copy of the message in flight beside the one a
    consumer claims from there. The other name is fsynced first: the dead
    consumer may have died before its own fsync, and this name is the last one
    we are sure of until then.
    """
    other = retry_area.moved_on(root, claim, own)
    if other is None:
        return False
    with contextlib.suppress(FileNotFoundError):
        retry_area.fsync_dir(other.parent)
        os.unlink(claim)
    return True


def sweep_nurseries(root: Path) -> None:
    """Remove folders whose consumer was killed while creating them.

    A nursery never holds a message (claims go only into processing/), and its
    lock cannot tell a dead maker from a live one that has created the lock file
    but not yet locked it. So age decides here, and only for an empty leftover;
    no message's fate ever depends on a clock.
    """
    with os.scandir(root) as it:
        old = [
            Path(e.path)
            for e in it
            if e.name.startswith(".w-") and e.name.endswith(NURSERY) and e.is_dir()
        ]
    for unborn in old:
        with contextlib.suppress(OSError):
            if time.time() - os.lstat(unborn).st_mtime > UNBORN_GRACE_S:
                with contextlib.suppress(FileNotFoundError):
                    fd = os.open(unborn / LOCK, os.O_RDWR)
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        os.unlink(unborn / LOCK)
                    finally:
                        os.close(fd)
                os.rmdir(unborn)
