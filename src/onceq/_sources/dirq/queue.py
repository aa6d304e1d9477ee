"""The directory queue: its folders, counting, producing into it, and replay.

    QDIR/inbox/NAME                  S1 queued (producers write .NAME.tmp, fsync, rename)
    QDIR/processing/w-ID/NAME        S2 claimed by worker ID (the rename that succeeded)
      … + ledger row committed       S3 effect durable, move pending
    QDIR/done/NAME                   S4 finished (processed or a duplicate)
    QDIR/error/NAME + failure row    S5 quarantined
    QDIR/retry/NAME + failure row    S6 waits for a retry, due at its mtime

Claiming, recovery and the moves after a commit belong to the consumer and live
in `onceq._sources.dirq.worker`; the no-clobber file operations in `onceq._sources.dirq.files`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from onceq._sources.dirq.files import check_name, fsync_dir, is_message_name, write_atomic
from onceq.errors import Conflict, NotFound, QueueError, UsageError

FOLDERS = ("inbox", "processing", "done", "error")
# Files waiting for a retry (onceq._sources.dirq.retry_area). Not in FOLDERS: it is created
# the first time a file waits, so a queue without it (the exercise's) is complete.
RETRY = "retry"


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
        inbox = self.folder("inbox")
        try:
            for f in FOLDERS:
                self.folder(f).mkdir(parents=True, exist_ok=True)
            for p in files:
                write_atomic(inbox, p.name, p.read_bytes())
            fsync_dir(inbox)
        except OSError as exc:  # a parent that is a file, a folder we may not write
            where = exc.filename or self.root
            raise QueueError(f"{where}: cannot create the queue: {exc.strerror}") from exc
        return len(files)

    def counts(self, folders: Sequence[str] = FOLDERS) -> dict[str, int]:
        """Message files per folder (processing/ counts every worker's claims).

        Dotfiles and *.tmp are a producer's unfinished writes and are not counted;
        `folders` lets `lag` skip done/, which only grows.
        """
        self.check()
        out = {}
        for f in folders:
            if f == RETRY and not self.folder(f).is_dir():
                out[f] = 0  # made on demand: a queue that never retried has none
                continue
            out[f] = sum(1 for _ in self._messages(self.folder(f), nested=(f == "processing")))
        return out

    def has_retry(self) -> bool:
        """Has a file ever waited for a retry here (QDIR/retry/ exists)?"""
        return self.folder(RETRY).is_dir()

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
        `record` runs BEFORE the file is linked into the inbox: a consumer may claim
        it the instant it is there, and must then find its attempts reset (schema
        3), not the old count that made it dead. If recording fails nothing has
        moved; a producer racing us for inbox/NAME after the checks leaves only a
        replay row behind (it resets a count: harmless), never a replaced file.
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
        if record is not None:
            record(name)
        try:
            os.link(src, dst)  # EEXIST refuses: never replaces a queued message
        except FileExistsError as exc:
            raise Conflict(f"{dst}: already in the inbox") from exc
        os.unlink(src)
        fsync_dir(self.folder("inbox"))
        fsync_dir(self.folder("error"))
        return dst
