"""The directory queue: folders, the claim, the finish, recovery and replay.

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

Moves out of processing/ never overwrite (link + unlink, which EEXIST refuses),
and the folders a group touched are fsynced once per group, after the ledger commit.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

from onceq.errors import Conflict, NotFound, UsageError
from onceq.transport import Delivery, Settle

FOLDERS = ("inbox", "processing", "done", "error")
LOCK = ".lock"


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


def move_no_clobber(src: Path, dst: Path) -> Path:
    """Move src to dst without ever replacing dst; returns where it went.

    rename(2) silently replaces its target, so a file goes by link + unlink. A
    crash between the two leaves the same inode in both places; the next attempt
    finds dst identical and only drops src. A different file already at dst makes
    the move go to dst.1, dst.2 …: a queue never loses a message to a name clash.
    """
    if src.is_dir() and not src.is_symlink():
        target = _free_name(dst)
        os.rename(src, target)  # our private processing folder: no race on target
        return target
    n = 0
    target = dst
    while True:
        try:
            os.link(src, target, follow_symlinks=False)
            break
        except FileExistsError:
            if _same_file(src, target):
                break
            n += 1
            target = dst.with_name(f"{dst.name}.{n}")
    os.unlink(src)
    return target


def _free_name(dst: Path) -> Path:
    n, target = 0, dst
    while os.path.lexists(target):
        n += 1
        target = dst.with_name(f"{dst.name}.{n}")
    return target


def _same_file(a: Path, b: Path) -> bool:
    try:
        sa, sb = os.lstat(a), os.lstat(b)
    except FileNotFoundError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


class DirQueue:
    """A queue directory: QDIR with inbox/ processing/ done/ error/ on one filesystem."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def folder(self, name: str) -> Path:
        return self.root / name

    @property
    def default_db(self) -> Path:
        return self.root / "ledger.db"

    def check(self) -> DirQueue:
        """Raise NotFound unless all four folders exist."""
        missing = [f for f in FOLDERS if not self.folder(f).is_dir()]
        if missing:
            raise NotFound(f"{self.root}: not a queue (missing {', '.join(missing)}/)")
        return self

    def init(self, source: str | Path | None = None) -> int:
        """Create the folders; copy source/*.json into inbox/. Returns the number copied.

        Checks everything before changing anything: a missing source, or a file that
        inbox/ already holds, refuses the whole command.
        """
        files: list[Path] = []
        if source is not None:
            src = Path(source)
            if not src.is_dir():
                raise NotFound(f"{src}: no such folder")
            files = sorted(p for p in src.glob("*.json") if p.is_file())
            clash = [p.name for p in files if os.path.lexists(self.folder("inbox") / p.name)]
            if clash:
                raise Conflict(f"{self.folder('inbox') / clash[0]}: already in the inbox")
        for f in FOLDERS:
            self.folder(f).mkdir(parents=True, exist_ok=True)
        inbox = self.folder("inbox")
        for p in files:
            write_atomic(inbox, p.name, p.read_bytes())
        fsync_dir(inbox)
        return len(files)

    def counts(self, folders: Sequence[str] = FOLDERS) -> dict[str, int]:
        """Message files per folder (processing/ counts every worker's claims).

        Dotfiles and *.tmp are a producer's unfinished writes and are not counted;
        `folders` lets `lag` skip done/, which only grows.
        """
        self.check()
        out = {}
        for f in folders:
            out[f] = sum(1 for _ in self._messages(self.folder(f), nested=(f == "processing")))
        return out

    def _messages(
        self, folder: Path, nested: bool = False, may_vanish: bool = False
    ) -> Iterator[str]:
        try:
            with os.scandir(folder) as it:
                for e in it:
                    if not is_message_name(e.name):
                        continue
                    if nested and e.is_dir(follow_symlinks=False):
                        # A worker's claim folder: its files are messages in flight.
                        yield from self._messages(Path(e.path), may_vanish=True)
                    else:
                        yield e.name
        except FileNotFoundError:
            # A worker removes its empty claim folder when it finishes; one that
            # vanished while we counted held nothing.
            if not may_vanish:
                raise

    def replay(self, name: str, record: Callable[[str], None] | None = None) -> Path:
        """Move error/NAME back to inbox/NAME; refuse, changing nothing, when it can't.

        Every check runs before anything changes, and `record` (which opens the
        ledger) is reached only by a replay that will happen: a refused replay
        leaves the folders and the database (even its absence) exactly as they were.
        `record` runs after the file is linked into the inbox and before it leaves
        error/: if recording fails the link is undone, so no replay goes unrecorded.
        """
        check_name(name)  # a bad name is a usage error whatever the folder holds
        self.check()
        src = self.folder("error") / name
        dst = self.folder("inbox") / name
        if not os.path.lexists(src):
            raise NotFound(f"{src}: no such file in error/")
        if src.is_symlink() or not src.is_file():
            raise UsageError(f"{src}: not a regular file; move it by hand")
        if os.path.lexists(dst):
            raise Conflict(f"{dst}: already in the inbox")
        try:
            os.link(src, dst)  # EEXIST refuses: never replaces a queued message
        except FileExistsError as exc:
            raise Conflict(f"{dst}: already in the inbox") from exc
        try:
            if record is not None:
                record(name)
        except BaseException:
            os.unlink(dst)
            raise
        os.unlink(src)
        fsync_dir(self.folder("inbox"))
        fsync_dir(self.folder("error"))
        return dst


class Worker:
    """One consumer's claim folder, lock and the Transport over it."""

    def __init__(self, queue: DirQueue, max_bytes: int) -> None:
        self.queue = queue.check()
        self.max_bytes = max_bytes  # larger files are never read into memory
        self.processing = queue.folder("processing")
        self.id = f"w-{os.getpid()}-{secrets.token_hex(3)}"
        self.dir = self.processing / self.id
        self._lock_fd: int | None = None
        self._stopped = False
        self._recovered: list[str] = []

    # --- life cycle -----------------------------------------------------------------

    def open(self) -> Worker:
        """Create processing/w-ID/ with its lock already held, then recover the dead."""
        # Build the folder under a dot name and lock it before it becomes visible, so
        # that no recovering consumer ever sees it unlocked and takes it over.
        tmp = self.processing / f".{self.id}"
        tmp.mkdir()
        fd = os.open(tmp / LOCK, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(tmp, self.dir)
        self._lock_fd = fd
        self._recovered = self._recover()
        return self

    def close(self) -> None:
        """Remove our folder if it is empty (processing/ ends empty), drop the lock."""
        if self._lock_fd is None:
            return
        leftover = [n for n in os.listdir(self.dir) if n != LOCK]
        if not leftover:
            os.unlink(self.dir / LOCK)
            os.rmdir(self.dir)
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
            if path == self.dir:
                continue
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
            # No lock file: a folder in the making (dot name) or a stray; leave the
            # making ones to their owner and take nothing.
            if dead.name.startswith("."):
                return []
            fd = None
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

    def _claim(self, src: Path, name: str) -> bool:
        """rename(2) src into our folder; False when another consumer won it."""
        if os.path.lexists(self.dir / name):
            return False  # a recovered file of the same name is still ours to finish
        try:
            os.rename(src, self.dir / name)
        except FileNotFoundError:
            return False
        return True

    # --- Transport ------------------------------------------------------------------

    def stop(self) -> None:
        self._stopped = True

    async def deliveries(self) -> AsyncIterator[Delivery]:
        """Recovered files first, then the inbox in name order until it is empty."""
        for name in self._recovered:
            yield self._delivery(name)
        self._recovered = []
        inbox = self.queue.folder("inbox")
        while not self._stopped:
            claimed = False
            for name in sorted(n for n in os.listdir(inbox) if is_message_name(n)):
                if self._stopped:
                    break
                if self._claim(inbox / name, name):
                    claimed = True
                    yield self._delivery(name)
            if not claimed:
                return

    def _delivery(self, name: str) -> Delivery:
        path = self.dir / name
        st = os.lstat(path)
        headers: dict[str, object] = {"kind": "file", "size": st.st_size}
        body = b""
        if os.path.islink(path):
            headers["kind"] = "symlink"
        elif os.path.isdir(path):
            headers["kind"] = "folder"
        elif st.st_size <= self.max_bytes:
            # O_NOFOLLOW: a symlink swapped in after the lstat is refused, not followed.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                body = f.read(self.max_bytes + 1)
            headers["size"] = len(body)
        return Delivery(body=body, ref=name, stable_ref=True, token=path, headers=headers)

    async def settle(self, group: Sequence[tuple[Delivery, Settle, str]]) -> None:
        """Move each file to done/ or error/ (its record is durable), then fsync folders."""
        done, error = self.queue.folder("done"), self.queue.folder("error")
        touched: set[Path] = set()
        for d, settle, _reason in group:
            # The directory queue has no second delivery: anything not ACKed is
            # quarantined, never put back in the inbox (that would be a poison loop).
            dest = done if settle is Settle.ACK else error
            move_no_clobber(d.token, dest / d.ref)
            touched.add(dest)
        for folder in (*touched, self.dir):
            fsync_dir(folder)
