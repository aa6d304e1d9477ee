"""How deep a directory queue is: its counts per folder and its oldest waiting file.

One scan serves /metrics (`DirScan`, refreshed in the background: in a child process,
onceq._sources.dirq.scanner) and `onceq status` (`dirq_depths`, once).

States: inbox, processing (every worker's claims), retry, error — the counts
`onceq dirq lag` prints (`DirQueue.counts`).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from onceq._core.waits import wait
from onceq._sources.dirq.files import is_message_name
from onceq._sources.dirq.queue import DirQueue
from onceq.errors import NotFound, OnceqError

EVERY_S = 5.0  # how often /metrics' figures are refreshed
DIRQ_STATES = ("inbox", "processing", "retry", "error")


class Scanner:
    """The parent's side: one child process per directory-queue flow."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        env = dict(os.environ)
        # The child imports the same onceq as this process, installed or not.
        here = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "onceq._sources.dirq.scanner",
            str(self.root),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=env,
        )

    async def scan(self) -> tuple[dict[str, int], float | None, str | None]:
        """(counts, oldest mtime, error); raises OSError/ValueError when the child is gone."""
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"\n")
        await proc.stdin.drain()
        line = await proc.stdout.readline()
        if not line:
            raise OSError("the scanner process ended")
        counts, oldest, error = json.loads(line)
        return counts, oldest, error

    async def aclose(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()  # its EOF: the child ends by itself
        try:
            await asyncio.wait_for(proc.wait(), 2.0)
        except (TimeoutError, ProcessLookupError):
            proc.kill()
            await proc.wait()


class DirScan:
    """A directory queue's counts and the age of its oldest inbox/ file, every EVERY_S s."""

    def __init__(self, root: str | Path, every: float = EVERY_S) -> None:
        self.root = Path(root)
        self.every = every
        self._counts: dict[str, int] = {}
        self._oldest_mtime: float | None = None
        # inbox/ name -> mtime, kept between scans: a waiting file's mtime does not
        # change, so only names not seen before are stat'ed. A scan of a standing
        # backlog is then one directory listing, not a stat per file (10,000 stats
        # took 43 ms of CPU here, and twice that of the consumer's loop through the
        # GIL: bench/metrics_cost.py measured it as 12 % of a directory queue's rate).
        self._mtimes: dict[str, float] = {}
        self.stats = 0  # stat calls made, all scans together (a test reads it)
        self.error: str | None = None

    def messages(self) -> dict[str, int]:
        return dict(self._counts)

    def oldest_age(self) -> float | None:
        if not self._counts:
            return None  # never read yet: no figure rather than a false 0
        if self._oldest_mtime is None:
            return 0.0
        return max(time.time() - self._oldest_mtime, 0.0)

    def scan(self) -> None:
        """One reading (blocking: run it in a thread)."""
        try:
            counts = DirQueue(self.root).counts(("processing", "retry", "error"))
            seen, mtimes = self._mtimes, {}
            # inbox/ counted and dated in one pass: a file's mtime is when its producer
            # renamed it in (write_atomic), i.e. when it started waiting.
            with os.scandir(self.root / "inbox") as it:
                for e in it:
                    name = e.name
                    if not is_message_name(name):
                        continue
                    mtime = seen.get(name)
                    if mtime is None:
                        self.stats += 1
                        try:
                            mtime = e.stat(follow_symlinks=False).st_mtime
                        except FileNotFoundError:
                            continue  # claimed while we looked
                    mtimes[name] = mtime
        except (OSError, OnceqError) as exc:
            # The folder vanished or cannot be read: keep the last figures (a scrape
            # shows what was last known); /healthz says the folder is gone.
            self.error = str(exc)
            return
        self.error = None
        # A name claimed and later queued again (a replay, a breaker's release) keeps
        # its old mtime here only if it never left between two scans: it is the same
        # waiting file then.
        self._mtimes = mtimes
        self._counts = {"inbox": len(mtimes), **counts}
        self._oldest_mtime = min(mtimes.values()) if mtimes else None

    @property
    def oldest_mtime(self) -> float | None:
        return self._oldest_mtime

    async def run(self, stop: asyncio.Event) -> None:
        """Scan every `every` s until `stop`: in a child process (onceq._sources.dirq.scanner:
        a scan in a thread holds the consumer's GIL), in a thread if the child fails."""

        scanner = Scanner(self.root)
        child: Scanner | None = scanner
        try:
            try:
                await scanner.start()
            except OSError:
                child = None
            while not stop.is_set():
                if child is not None:
                    try:
                        counts, oldest, error = await child.scan()
                    except (OSError, ValueError):
                        await child.aclose()
                        child = None  # gone: the thread from now on
                        continue
                    self.error = error
                    if error is None:
                        self._counts, self._oldest_mtime = counts, oldest
                else:
                    await asyncio.to_thread(self.scan)
                await wait(stop, self.every)
        finally:
            if child is not None:
                await child.aclose()


def dirq_depths(root: str | Path, now: datetime | None = None) -> dict[str, Any]:
    """inbox / processing / retry / error counts (as `dirq lag`) and the age in seconds
    of the oldest inbox file (None when the inbox is empty); NotFound for no queue.

    The same one scan /metrics makes (`DirScan`)."""
    scan = DirScan(root)
    scan.scan()
    if scan.error is not None:
        raise NotFound(scan.error)
    oldest = scan.oldest_mtime
    stamp = now.timestamp() if now is not None else time.time()
    age = None if oldest is None else round(max(0.0, stamp - oldest), 3)
    return {"kind": "dirq", "path": str(Path(root)), **scan.messages(), "oldest_age_s": age}
