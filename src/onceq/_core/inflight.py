"""The cross-process in-flight guard: one copy of a msg_id in flight across processes.

`Consumer` already lets one copy of a msg_id in flight per process (`Turns`, below).
Twins of one message in two consumer processes (two hosts on one broker, a re-sent
copy, a redelivery after another consumer's connection dropped) could both call the
partner; the guard makes the second wait until the first is recorded, then the
ledger calls it a duplicate. The guard lives beside the ledger, because that is what
every consumer of a flow shares:

Each ledger makes its own (`inflight_guard()`; `guard_for` asks it), so the loop
never chooses a database's guard:

- PostgreSQL (`onceq._ledger.pg.guard.PgGuard`): a session-level advisory lock per (flow,
  msg_id) on a connection of its own. The holder's death closes its session and the
  server drops its locks, so a kill -9 never leaves a lease that blocks a message for
  ever.
- SQLite (`onceq._ledger.file_guard.FileGuard`): every consumer of an SQLite ledger
  is on one host (`dirq consume --workers N`, two `mq consume` on one file), so a
  byte-range lock per msg_id on the file `<ledger>-inflight` does it; the kernel
  drops a process's locks when it dies, kill -9 included. It costs two system calls
  per message (measured: see `FileGuard`), so it is always on.

Order in the loop (`Consumer._handle`): in-process turn → `claim` (waits while
another process holds the msg_id) → the duplicate check → the call → commit → settle
→ `release`. The duplicate check comes AFTER the claim: a twin that committed while
we waited is found then. A guard that can read the ledger on the way may do the check
itself, in the claim's round trip (PgGuard: one round trip per tick instead of two),
and answer `Checked(ref)`; a guard that answers None (FileGuard, a user's) leaves the
check to the loop.

The guard is an optimisation of *calls*, never of correctness: if it is lost (its
connection drops), the loop goes on and the ledger's primary key still records each
message once; at worst a partner sees a twin's call (at-least-once).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

# A claim that finds its msg_id held polls: first soon (the twin's call may be nearly
# done), then less often, so a slow partner's twins cost a few wake-ups, not a spin.
POLL_FIRST_S = 0.005
POLL_MAX_S = 0.2


@dataclass(frozen=True)
class Checked:
    """A claim that also did the duplicate check, AFTER the lease was held: `ref` is
    what `Ledger.processed_ref` would answer then (the ref that took effect, '' when
    it has none, None when the msg_id is unseen).

    A class of its own, not a bare `str | None`: None from `claim` means "not looked
    up" (the old protocol), and mistaking that for "unseen" would skip the check."""

    ref: str | None


@runtime_checkable
class InflightGuard(Protocol):
    """What the loop asks of a cross-process guard (all calls from the event loop)."""

    async def claim(self, msg_id: str) -> Checked | None:
        """Return once this process holds msg_id's lease (waits while another holds it):
        `Checked` when the guard did the duplicate check after taking it, else None."""

    async def release(self, msg_id: str) -> None:
        """Give msg_id's lease back (after its outcome is committed and settled)."""

    async def aclose(self) -> None:
        """Release everything and close what the guard holds (a connection)."""


class _HasGuard(Protocol):
    def inflight_guard(self) -> InflightGuard | None: ...


def guard_for(ledger: _HasGuard) -> InflightGuard | None:
    """The guard that fits `ledger`, made by the ledger itself (PgGuard for PostgreSQL,
    FileGuard beside an SQLite file): core never chooses a database's guard."""
    return ledger.inflight_guard()


class Slots:
    """The loop's `max_in_flight` slots: one taken per delivery, given back after its
    settle (or when it is given up), by the committer or the copy's task.

    A counter and a line of waiters rather than an asyncio.Semaphore: a free slot is
    taken with no coroutine (`take_now`, every delivery while the window has room),
    and a slot given back while someone waits is handed to the first waiter, never
    left for whoever asks next."""

    __slots__ = ("_free", "_waiters", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = size
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def taken(self) -> int:
        return self.size - self._free

    def take_now(self) -> bool:
        """Take a free slot without waiting (True), or none (False)."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():  # a waiter that gave up (cancelled) takes nothing
                waiter.set_result(None)  # the slot is its own now
                return
        self._free += 1

    async def take(self, committer: asyncio.Future[Any]) -> bool:
        """Take a slot, waiting for one (True), or give up when the committer has
        ended (False).

        Slots come back only from the committer; if it died (a ledger error) while
        every slot was taken, a plain wait would last forever instead of letting
        the run stop and report the error.
        """
        if self.take_now():
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait([waiter, committer], return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not waiter.done():
                waiter.cancel()  # release() skips it
        return not waiter.cancelled()


class Turns:
    """One copy of a msg_id in flight in this process: a later copy waits for the
    first to be settled (and to give its lease back) before it claims the lease.

    The first copy of an id only marks it (no Event: almost every id is alone); a
    twin that finds it marked makes the Event it waits on, and the holder's
    `give_back` sets it."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[str, asyncio.Event | None] = {}

    def try_take(self, msg_id: str) -> bool:
        """Take msg_id's turn if nobody holds it (no wait): True when taken."""
        if msg_id in self._held:
            return False
        self._held[msg_id] = None
        return True

    async def take(self, msg_id: str) -> None:
        """Take msg_id's turn, waiting while another copy of this process holds it."""
        while msg_id in self._held:
            ev = self._held[msg_id]
            if ev is None:
                ev = self._held[msg_id] = asyncio.Event()
            await ev.wait()
        self._held[msg_id] = None

    def give_back(self, msg_id: str) -> None:
        ev = self._held.pop(msg_id)
        if ev is not None:
            ev.set()


class Leases:
    """The loop's side of a guard: open it for a run, claim with a stop in mind.

    `claim` answers (leased, checked): leased is False without a guard, and when
    `stop()` cut the wait for a twin elsewhere short (a stop starts no new call; the
    copy ends unsettled); checked is the guard's `Checked` or None (see `Checked`). Cut by
    cancelling the waiting tasks: no extra task or event per message on the way.
    """

    def __init__(self, make: Callable[[Any], InflightGuard | None] = guard_for) -> None:
        self.make = make
        self.guard: InflightGuard | None = None
        self.stopped = False
        self._waiting: set[asyncio.Task[Any]] = set()
        self._bind()

    def _bind(self) -> None:
        """`claim_now` and `release_now`: the guard's own methods when it has them
        (FileGuard), called by the loop with no wrapper in between (one Python call a
        message each instead of two)."""
        guard = self.guard
        try_claim = getattr(guard, "try_claim", None)
        release_now = getattr(guard, "release_now", None)
        # Take msg_id's lease at once when the guard can (FileGuard) and it is free:
        # True. False: `claim` decides (it may wait). Such a guard does no duplicate
        # check (None for `checked`).
        self.claim_now: Callable[[str], bool] = try_claim or _never
        # Release without a coroutine when the guard can (True), else leave it to
        # `release` (False). No guard: nothing to give back (True).
        self.release_now: Callable[[str], bool] = release_now or (
            _always if guard is None else _never
        )

    def open(self, ledger: Any) -> None:
        self.guard = self.make(ledger)
        # A guard that can answer without waiting (FileGuard) is asked that way first:
        # no task bookkeeping and no coroutine for a free id, the common case.
        self._bind()

    async def claim(self, msg_id: str) -> tuple[bool, Checked | None]:
        if self.guard is None:
            return False, None
        task = asyncio.current_task()
        assert task is not None
        self._waiting.add(task)
        try:
            checked = await self.guard.claim(msg_id)
        except asyncio.CancelledError:
            if not self.stopped:
                raise
            task.uncancel()
            # Cut as its answer arrived, the lease may be ours: give it back.
            await self.guard.release(msg_id)
            return False, None
        finally:
            self._waiting.discard(task)
        return True, checked if isinstance(checked, Checked) else None

    async def release(self, msg_id: str) -> None:
        if self.guard is not None:
            await self.guard.release(msg_id)

    def stop(self) -> None:
        self.stopped = True
        for task in self._waiting:
            task.cancel()

    async def aclose(self) -> None:
        guard, self.guard = self.guard, None
        self._bind()
        if guard is not None:
            # Closing gives back every lease (a PostgreSQL session's locks go with it).
            await guard.aclose()


def _never(msg_id: str) -> bool:
    return False


def _always(msg_id: str) -> bool:
    return True
