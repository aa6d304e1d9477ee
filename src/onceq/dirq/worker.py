"""One consumer of a directory queue: its claim folder, lock, recovery and moves.

    QDIR/inbox/NAME                  S1 queued (producers write .NAME.tmp, fsync, rename)
    QDIR/processing/w-ID/NAME        S2 claimed by worker ID (the rename that succeeded)
      … + ledger row committed       S3 effect durable, move pending
    QDIR/done/NAME                   S4 finished (processed or a duplicate)
    QDIR/error/NAME + failure row    S5 quarantined

Each consumer claims into a folder of its own, processing/w-ID/, and holds an
exclusive flock on processing/w-ID/.lock for as long as it lives. The lock, not the
age of a file, says whether a claimed file has an owner: the kernel drops it when
the process dies, however it dies (kill -9 included). A consumer that starts takes
over every processing/w-*/ whose lock it can get, and runs those files again; the
ledger recognises the ones that were already committed.

Moves out of processing/ never overwrite (link + unlink, which EEXIST refuses).
After the ledger commit, a group's files are all linked into done/ or error/, those
folders are fsynced once, and only then are the claims unlinked.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import secrets
import stat
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from onceq import faults
from onceq.dirq.files import is_message_name, link_no_clobber, open_dir
from onceq.dirq.message import DEFAULT_MAX_BYTES
from onceq.dirq.queue import FOLDERS, DirQueue
from onceq.errors import QueueError
from onceq.transport import Delivery, Settle

LOCK = ".lock"
# A consumer builds its claim folder as QDIR/.w-ID.new and moves it into processing/
# within microseconds; a nursery this old was left by a kill.
NURSERY = ".new"
UNBORN_GRACE_S = 60.0


class Worker:
    """One consumer's claim folder, lock and the Transport over it."""

    # A directory queue never redelivers: what fails is quarantined at once (putting it
    # back in inbox/ would be the poison loop), so one try is all a message gets here.
    max_attempts = 1

    def __init__(self, queue: DirQueue, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.queue = queue.check()
        self.max_bytes = max_bytes  # larger files are never read into memory
        self.processing = queue.folder("processing")
        self.id = f"w-{os.getpid()}-{secrets.token_hex(3)}"
        self.dir = self.processing / self.id
        self._dir = os.fspath(self.dir)  # str: the hot path builds paths by f-string
        self._held: set[str] = set()  # names in our folder, claimed and not yet settled
        self._lock_fd: int | None = None
        self._fds: dict[str, int] = {}  # open folders: inbox, done, error, own
        self._stopped = False
        self._recovered: list[str] = []

    # --- life cycle -----------------------------------------------------------------

    def open(self) -> Worker:
        """Create processing/w-ID/ with its lock already held, then recover the dead."""
        # Build the folder outside processing/ (QDIR/.w-ID.new), lock it there, then
        # move it in: a folder in processing/ has its lock held from its first
        # instant, so no recovering consumer ever mistakes a starting consumer for a
        # dead one. A kill before the move leaves an empty nursery folder that no
        # consumer scans for claims; a later one removes it.
        self._check_writable()
        try:
            self._sweep_nurseries()
            tmp = self.queue.root / f".{self.id}{NURSERY}"
            tmp.mkdir()
            fd = os.open(tmp / LOCK, os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(tmp, self.dir)
        except OSError as exc:  # e.g. no room for the claim folder: nothing claimed yet
            raise QueueError(
                f"{self.queue.root}: cannot start a consumer here: {exc.strerror}"
            ) from exc
        self._lock_fd = fd
        # Folder descriptors for the hot path: each claim, read and move is a call
        # relative to an open folder instead of a walk down the whole path.
        self._fds = {f: open_dir(self.queue.folder(f)) for f in ("inbox", "done", "error")}
        self._fds["own"] = open_dir(self.dir)
        self._recovered = self._recover()
        return self

    def _check_writable(self) -> None:
        """Refuse, before claiming anything, a queue whose folders we cannot change.

        Found only at the first move, a read-only done/ would stop the run with a
        whole group claimed (safe, but the user's command was refused half-way).
        """
        for path in (self.queue.root, *(self.queue.folder(f) for f in FOLDERS)):
            if not os.access(path, os.W_OK | os.X_OK):
                raise QueueError(f"{path}: not writable here; a consumer moves files in it")

    def close(self) -> None:
        """Remove our folder if it is empty (processing/ ends empty), drop the lock."""
        if self._lock_fd is None:
            return
        leftover = [n for n in os.listdir(self.dir) if n != LOCK]
        if not leftover:
            os.unlink(self.dir / LOCK)
            os.rmdir(self.dir)
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}
        os.close(self._lock_fd)
        self._lock_fd = None

    def __enter__(self) -> Worker:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _recover(self) -> list[str]:
        """Take over the claims of every dead consumer; returns the names taken."""
        taken: list[str] = []
        with os.scandir(self.processing) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            path = Path(e.path)
            if path == self.dir or e.name.startswith("."):
                continue  # ours, or not a claim (a producer's or a user's dotfile)
            if e.is_dir(follow_symlinks=False):
                taken += self._take_over(path)
            elif is_message_name(e.name) and self._claim(path, e.name):
                # A loose file (an older consumer, a hand move): claimed like an inbox file.
                taken.append(e.name)
        return taken

    def _take_over(self, dead: Path) -> list[str]:
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
            taken = [n for n in sorted(os.listdir(dead)) if n != LOCK and self._claim(dead / n, n)]
            with contextlib.suppress(OSError):
                if fd is not None:
                    os.unlink(dead / LOCK)
                os.rmdir(dead)
            return taken
        finally:
            if fd is not None:
                os.close(fd)

    def _sweep_nurseries(self) -> None:
        """Remove folders whose consumer was killed while creating them.

        A nursery never holds a message (claims go only into processing/), and its
        lock cannot tell a dead maker from a live one that has created the lock file
        but not yet locked it. So age decides here, and only for an empty leftover;
        no message's fate ever depends on a clock.
        """
        with os.scandir(self.queue.root) as it:
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

    def _claim(self, src: str | Path, name: str, src_dir_fd: int | None = None) -> bool:
        """rename(2) src (in src_dir_fd) into our folder; False when another consumer won it."""
        # rename would silently replace a file of the same name that we still hold
        # (a recovered one, or one claimed earlier and not yet settled). Only this
        # process writes into its folder, so the set in memory is exact, and it
        # saves a stat per message.
        if name in self._held:
            return False
        try:
            os.rename(src, name, src_dir_fd=src_dir_fd, dst_dir_fd=self._fds["own"])
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise QueueError(f"{self.dir}: cannot claim {name}: {exc.strerror}") from exc
        self._held.add(name)
        faults.hit("after-claim")
        return True

    # --- Transport ------------------------------------------------------------------

    def stop(self) -> None:
        self._stopped = True

    async def deliveries(self) -> AsyncIterator[Delivery]:
        """Recovered files first, then the inbox in name order until it is empty."""
        for name in self._recovered:
            # redelivered: this copy may have been handled (even committed) before.
            yield self._delivery(name, redelivered=True)
        self._recovered = []
        inbox = self._fds["inbox"]
        while not self._stopped:
            claimed = False
            for name in sorted(n for n in os.listdir(inbox) if is_message_name(n)):
                if self._stopped:
                    break
                if self._claim(name, name, inbox):
                    claimed = True
                    yield self._delivery(name)
            if not claimed:
                return

    def _delivery(self, name: str, redelivered: bool = False) -> Delivery:
        own = self._fds["own"]
        st = os.lstat(name, dir_fd=own)  # one stat says what it is; nothing below follows a link
        headers: dict[str, object] = {"kind": "file", "size": st.st_size}
        body = b""
        if stat.S_ISLNK(st.st_mode):
            headers["kind"] = "symlink"
        elif stat.S_ISDIR(st.st_mode):
            headers["kind"] = "folder"
        elif not stat.S_ISREG(st.st_mode):
            headers["kind"] = "special"  # a FIFO or device: opening it could block forever
        elif st.st_size <= self.max_bytes:
            # O_NOFOLLOW: a symlink swapped in after the lstat is refused, not followed.
            # O_NONBLOCK: nor does a FIFO swapped in make us wait for a writer.
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=own)
            except OSError as exc:
                # Another user's file we may not read: it is quarantined (replayable
                # once its mode is fixed) rather than stopping the queue behind it.
                headers["kind"] = "unreadable"
                headers["detail"] = exc.strerror or str(exc)
                return Delivery(
                    b"", name, redelivered=redelivered, stable_ref=True, token=name, headers=headers
                )
            try:
                # Read what the lstat promised plus one byte, up to the limit + 1: a
                # file that grew past the limit meanwhile is seen as too large, and
                # no buffer of max_bytes is allocated for a small message. A short
                # read of a regular file is its end: no extra read to see EOF.
                want = min(st.st_size, self.max_bytes) + 1
                chunks = []
                while want > 0 and (chunk := os.read(fd, want)):
                    chunks.append(chunk)
                    if len(chunk) < want:
                        break
                    want -= len(chunk)
            finally:
                os.close(fd)
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            headers["size"] = len(body)
        return Delivery(
            body=body,
            ref=name,
            redelivered=redelivered,
            stable_ref=True,
            token=name,
            headers=headers,
        )

    async def settle(self, group: Sequence[tuple[Delivery, Settle, str]]) -> None:
        """Move each file to done/ or error/ (its record is durable), then fsync folders."""
        # The moves are system calls that release the GIL: in a thread they run on
        # the second core while the loop claims and reads the next group.
        await asyncio.to_thread(self._move_group, group)

    def _move_group(self, group: Sequence[tuple[Delivery, Settle, str]]) -> None:
        own = self._fds["own"]
        touched: set[str] = set()
        to_unlink: list[str] = []
        for d, settle, _reason in group:
            # The directory queue has no second delivery: anything not ACKed is
            # quarantined, never put back in the inbox (that would be a poison loop).
            dest = "done" if settle is Settle.ACK else "error"
            try:
                _, linked = link_no_clobber(
                    d.token, d.ref, src_dir_fd=own, dst_dir_fd=self._fds[dest]
                )
            except OSError as exc:
                # The records are durable and the claims stay in our folder: the next
                # run takes them over and finishes these moves (nothing lost, nothing
                # applied twice). The run stops: every later move would fail alike.
                raise QueueError(
                    f"{self.queue.folder(dest)}: cannot move {d.ref} there: {exc.strerror};"
                    " the claimed files wait in processing/ for the next run"
                ) from exc
            if linked:
                to_unlink.append(d.token)
            touched.add(dest)
            faults.hit("mid-settle")  # linked, not yet fsynced nor unlinked
        # The new names are durable before any old one goes (one fsync per folder
        # per group, not per file): a power cut can leave a file in both places,
        # which recovery finishes like a crash between link and unlink, but never
        # in neither.
        for folder in touched:
            os.fsync(self._fds[folder])
        for name in to_unlink:
            os.unlink(name, dir_fd=own)
        # Our own folder is not fsynced: an unlink lost to a power cut leaves the
        # same inode in done/ and here, and the next consumer only drops this name.
        # Forgotten only once gone from our folder: until then a claim of the same
        # name must not rename over it.
        self._held.difference_update(d.ref for d, _, _ in group)
