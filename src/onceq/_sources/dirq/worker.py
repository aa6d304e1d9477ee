"""One consumer of a directory queue: its claim folder, lock, claims and moves.

    QDIR/inbox/NAME                  S1 queued (producers write .NAME.tmp, fsync, rename)
    QDIR/processing/w-ID/NAME        S2 claimed by worker ID (the rename that succeeded)
      … + ledger row committed       S3 effect durable, move pending
    QDIR/done/NAME                   S4 finished (processed or a duplicate)
    QDIR/error/NAME + failure row    S5 quarantined
    QDIR/retry/NAME + failure row    S6 waits for a retry, due at its mtime
                                        (onceq._sources.dirq.retry_area); claimed like S1

Each consumer claims into a folder of its own, processing/w-ID/, and holds an
exclusive flock on processing/w-ID/.lock for as long as it lives. The lock, not the
age of a file, says whether a claimed file has an owner: the kernel drops it when
the process dies, however it dies (kill -9 included). A consumer that starts takes
over every processing/w-*/ whose lock it can get, and runs those files again; the
ledger recognises the ones that were already committed (onceq._sources.dirq.takeover).

Moves out of processing/ never overwrite (link + unlink, which EEXIST refuses).
After the ledger commit, a group's files are all linked into done/, error/, retry/
(a transient failure) or back into inbox/ (released untried: the breaker is open),
those folders are fsynced once, and only then are the claims unlinked. A group's
moves run in a thread of their own while the committer commits the next group
(`Mover` in onceq._sources.dirq.files: why that keeps every guarantee).

Claiming takes the due files of retry/ first (oldest due first), then the inbox in
name order. `deliveries()` ends only when there is nothing left for this consumer:
nothing claimable, nothing of ours unsettled (a settle may put a file back), and
nothing waiting in retry/ (it sleeps until the next is due); with `follow` it never
ends by itself. While paused (the breaker is open) it claims nothing but one file
per probe(), and waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import math
import os
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from onceq._core import faults
from onceq._core.message import DEFAULT_MAX_BYTES
from onceq._core.transport import ACK, DELAY, Delivery, Settle
from onceq._core.waits import wait
from onceq._sources.dirq import retry_area
from onceq._sources.dirq.files import DEST, Mover, link_no_clobber, move_error, open_dir
from onceq._sources.dirq.queue import FOLDERS, DirQueue
from onceq._sources.dirq.read import read_claim
from onceq._sources.dirq.takeover import LOCK, NURSERY, recover, sweep_nurseries
from onceq.errors import QueueError

__all__ = ["LOCK", "POLL_SECONDS", "Worker"]

POLL_SECONDS = 0.5  # a directory queue has no push: an idle inbox is looked at this often
_NEVER = math.inf


class Worker:
    """One consumer's claim folder, lock and the Transport over it.

    `follow`: keep waiting for new files when the queue is empty (a service) instead
    of ending (a batch: `dirq consume`, `onceq run --until-empty`).
    """

    # Without a retry policy the loop gives a message this many tries: a directory
    # queue's transient failure waits in retry/, so the policy (RetryPolicy) decides;
    # this is only the fallback of a Consumer built without one (the orders preset's
    # rule: the first failure is quarantined).
    max_attempts = 1

    def __init__(
        self, queue: DirQueue, max_bytes: int = DEFAULT_MAX_BYTES, *, follow: bool = False
    ) -> None:
        self.queue = queue.check()
        self.max_bytes = max_bytes  # larger files are never read into memory
        self.follow = follow
        self.processing = queue.folder("processing")
        self.id = f"w-{os.getpid()}-{secrets.token_hex(3)}"
        self.dir = self.processing / self.id
        self._dir = os.fspath(self.dir)  # str: the hot path builds paths by f-string
        self._held: set[str] = set()  # names in our folder, claimed and not yet settled
        self._lock_fd: int | None = None
        self._fds: dict[str, int] = {}  # open folders: inbox, done, error, own
        self._stopped = False
        self._recovered: list[str] = []
        self._paused = False
        self._probes = 0  # files we may claim while paused (the breaker's probe)
        self._next_due = math.inf  # the earliest future due time we know of in retry/
        self._changed: asyncio.Event | None = None  # a settle, stop, resume or probe
        self._mover: Mover | None = None  # the moves after a commit (open() makes it)

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
            sweep_nurseries(self.queue.root)
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
        self._mover = Mover(self._move_group)
        self._recovered = recover(self.queue.root, self.processing, self.dir, self._claim)
        return self

    def _check_writable(self) -> None:
        """Refuse, before claiming anything, a queue whose folders we cannot change.

        Found only at the first move, a read-only done/ would stop the run with a
        whole group claimed (safe, but the user's command was refused half-way).
        """
        retry = self.queue.folder(retry_area.RETRY)
        extra = [retry] if retry.is_dir() else []  # created on demand: absent is fine
        for path in (self.queue.root, *(self.queue.folder(f) for f in FOLDERS), *extra):
            if not os.access(path, os.W_OK | os.X_OK):
                raise QueueError(f"{path}: not writable here; a consumer moves files in it")

    def close(self, raise_failure: bool = True) -> None:
        """Wait for the moves under way, remove our folder if it is empty (processing/
        ends empty), drop the lock; then raise a failed move nobody has raised yet."""
        if self._lock_fd is None:
            return
        failure = self._mover.close() if self._mover is not None else None
        self._mover = None
        leftover = [n for n in os.listdir(self.dir) if n != LOCK]
        if not leftover:
            os.unlink(self.dir / LOCK)
            # From here another consumer's recovery may find our folder without its
            # lock file, take it for a stray one and remove it (empty: nothing to take),
            # before we do: gone is what we want either way.
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(self.dir)
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}
        os.close(self._lock_fd)
        self._lock_fd = None
        if failure is not None and raise_failure:
            raise failure

    def __enter__(self) -> Worker:
        return self.open()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(raise_failure=exc_type is None)  # never over an error under way

    def _retry_fd(self, create: bool = False) -> int | None:
        """retry/'s descriptor; None while the queue has no retry/ (made on demand)."""
        fd = self._fds.get("retry")
        if fd is None:
            fd = retry_area.open_retry(self.queue.root, create)
            if fd is not None:
                self._fds["retry"] = fd
        return fd

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
            raise self._claim_error(name, exc) from exc
        self._held.add(name)
        faults.hit("after-claim")
        return True

    def _claim_error(self, name: str, exc: OSError) -> QueueError:
        return QueueError(f"{self.dir}: cannot claim {name}: {exc.strerror}")

    # --- Transport ------------------------------------------------------------------

    def stop(self) -> None:
        self._stopped = True
        self._wake()

    def pause(self) -> None:
        """Claim nothing more until resume() (the breaker opened); deliveries() waits."""
        self._paused = True
        self._probes = 0

    def resume(self) -> None:
        self._paused = False
        self._wake()

    def probe(self) -> None:
        """While paused, claim one more file (the breaker's probe)."""
        self._probes = 1
        self._wake()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()

    def _may_claim(self) -> bool:
        return not self._stopped and (not self._paused or self._probes > 0)

    def _took(self) -> None:
        if self._paused:
            self._probes -= 1

    async def _wait(self, seconds: float | None) -> None:
        """Until a settle, stop, resume or probe, or `seconds` (None: no limit)."""
        assert self._changed is not None
        self._changed.clear()
        await wait(self._changed, seconds)

    async def deliveries(self) -> AsyncIterator[Delivery]:
        """Recovered files, then due retries and the inbox, until nothing is left (module)."""
        self._changed = asyncio.Event()
        for name in self._recovered:
            # redelivered: this copy may have been handled (even committed) before.
            yield self._delivery(name, redelivered=True)
        self._recovered = []
        inbox = self._fds["inbox"]
        while not self._stopped:
            if not self._may_claim():
                await self._wait(None)  # paused: only resume, probe or stop goes on
                continue
            claimed = False
            retry = self._retry_fd()
            if retry is not None:
                due, self._next_due = retry_area.scan(retry, time.time())
                for name in due:
                    if not self._may_claim():
                        break
                    if self._claim(name, name, retry):
                        claimed = True
                        self._took()
                        yield self._delivery(name)
            # The checks of _may_claim and _took, and _claim itself, written out, and
            # the claim read at once: this loop runs once per message, and each call
            # saved here shows in a run's instructions per message (_claim inline:
            # 33.2k -> 32.6k instructions per file for the transport alone).
            own, max_bytes, held = self._fds["own"], self.max_bytes, self._held
            hit = faults.hit if faults.ARMED else None  # no call per file unless armed
            names = [n for n in os.listdir(inbox) if n[0] != "." and not n.endswith(".tmp")]
            names.sort()  # is_message_name, inline: dotfiles and *.tmp are partial writes
            for name in names:
                # A retry that fell due meanwhile goes before the rest of the inbox
                # (no clock read while none is known: _next_due is then _NEVER).
                if (
                    self._stopped
                    or (self._paused and self._probes <= 0)
                    or (self._next_due < _NEVER and time.time() >= self._next_due)
                ):
                    break
                if name in held:  # _claim: never rename over a file we still hold
                    continue
                try:
                    os.rename(name, name, src_dir_fd=inbox, dst_dir_fd=own)
                except FileNotFoundError:
                    continue  # another consumer won it
                except OSError as exc:
                    raise self._claim_error(name, exc) from exc
                held.add(name)
                if hit is not None:
                    hit("after-claim")
                claimed = True
                if self._paused:
                    self._probes -= 1
                yield read_claim(name, own, max_bytes)
            if claimed or self._stopped:
                continue
            if self._held:
                await self._wait(None)  # its settle may put a file back (retry/, inbox/)
                if self._mover is not None:
                    self._mover.raise_failure()  # a failed move: those never come back
            elif self.follow:
                await self._wait(min(POLL_SECONDS, max(self._next_due - time.time(), 0)))
            elif not math.isinf(self._next_due):
                # Only future retries remain: sleep until the first is due.
                await self._wait(max(self._next_due - time.time(), 0))
            else:
                return

    def _delivery(self, name: str, redelivered: bool = False) -> Delivery:
        return read_claim(name, self._fds["own"], self.max_bytes, redelivered)

    async def settle(self, group: Sequence[tuple[Delivery, Settle, str]]) -> None:
        """Hand the moves of each file to done/, error/, retry/ or inbox/ to the mover
        (their records are durable) and return; `moved()` waits for them."""
        # Behind the committer, in a thread of their own: the next commit runs while
        # these files move (`files.Mover`: why no guarantee moves with them). The
        # previous group's moves first: one group moving at a time, in order.
        assert self._mover is not None, "open() first"
        await self.moved()
        loop = asyncio.get_running_loop()

        def done(due: float | None) -> None:  # in the mover's thread; a loop already
            with contextlib.suppress(RuntimeError):  # closed has nobody left to wake
                loop.call_soon_threadsafe(self._moved, due)

        self._mover.submit(group, done)

    async def moved(self) -> None:
        """Until every file settled so far is moved; raises a failed move's error."""
        last = None if self._mover is None else self._mover.last
        if last is None:
            return
        if not last.done():  # shielded: a cancelled waiter leaves them running
            with contextlib.suppress(Exception):  # (raised below, from the future)
                await asyncio.shield(asyncio.wrap_future(last))
        assert self._mover is not None
        self._mover.raise_failure()

    def _moved(self, due: float | None) -> None:
        """A group's moves ended (`due`: the earliest it put in retry/; None: failed)."""
        if due is not None:
            self._next_due = min(self._next_due, due)
        self._wake()  # deliveries() may be waiting for these files to settle

    def _move_group(self, group: Sequence[tuple[Delivery, Settle, str]]) -> float:
        """The moves of one group; returns the earliest due time it put in retry/."""
        fds = self._fds
        own, done = fds["own"], fds["done"]
        touched: set[str] = set()
        to_unlink: list[str] = []
        now = time.time()
        earliest = math.inf
        link = os.link
        acked = False
        # Per file, the fault point costs a call only when one is armed (a test).
        hit = faults.hit if faults.ARMED else None
        for d, settle, _reason in group:
            token = d.token
            # ACK (nearly every file) by identity, with done/'s descriptor at hand: an
            # enum's hash is a Python-level call, paid per file by a table lookup.
            if settle is ACK:
                dest, dst_fd, acked = "done", done, True
            else:
                dest = DEST[settle]
                touched.add(dest)
                if dest == "retry":
                    # The due time goes on the claimed file BEFORE it has a name in
                    # retry/: no instant shows the file in retry/ without it (it would
                    # be due at once, its old mtime being in the past). A crash before
                    # the link leaves the claim for recovery, which runs it again
                    # (early, not lost).
                    due = now + (d.delay if settle is DELAY else 0.0)
                    retry_area.set_due(token, own, due)
                    earliest = min(earliest, due)
                    self._retry_fd(create=True)
                dst_fd = fds[dest]
            try:
                # link(2) first, plain: it is itself the no-clobber check, and it is
                # the whole move but for a name taken (EEXIST) or a folder (EPERM),
                # which link_no_clobber sorts out.
                link(token, d.ref, src_dir_fd=own, dst_dir_fd=dst_fd, follow_symlinks=False)
                to_unlink.append(token)
            except (FileExistsError, PermissionError):
                try:
                    _, linked = link_no_clobber(token, d.ref, src_dir_fd=own, dst_dir_fd=dst_fd)
                except OSError as exc:
                    raise move_error(self.queue.folder(dest), d.ref, exc) from exc
                if linked:  # a folder was renamed whole: no name left to unlink
                    to_unlink.append(token)
            except OSError as exc:
                raise move_error(self.queue.folder(dest), d.ref, exc) from exc
            # Linked, not yet fsynced nor unlinked: the file is in two places.
            if hit is not None:
                hit("after-retry-link" if dest == "retry" else "mid-settle")
        if acked:
            touched.add("done")
        # The new names are durable before any old one goes (one fsync per folder
        # per group, not per file): a power cut can leave a file in both places,
        # which recovery finishes like a crash between link and unlink, but never
        # in neither.
        for folder in touched:
            os.fsync(fds[folder])
        unlink = os.unlink
        for name in to_unlink:
            unlink(name, dir_fd=own)
        # Our own folder is not fsynced: an unlink lost to a power cut leaves the
        # same inode in done/ and here, and the next consumer only drops this name
        # (or, for retry/ and inbox/, `takeover.finish_move` does).
        # The due time is known before the names are forgotten: deliveries() that
        # finds nothing held and no retry due would end the batch, with this file
        # waiting in retry/ (`_moved` only comes later, through the loop).
        if earliest < self._next_due:
            self._next_due = earliest
        # Forgotten only once gone from our folder: until then a claim of the same
        # name must not rename over it.
        self._held.difference_update([d.ref for d, _, _ in group])
        return earliest
