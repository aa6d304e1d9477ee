"""The committer: record a group of outcomes, then settle it, then give back what it held.

One task per consumer (`Consumer.run` starts it) reads what the handlers hand over
(`onceq._core.handoff`), in their order, and for each group of up to `max_group`:

1. commits the group's records in one durable transaction (in a thread: the commit
   blocks on fsync and the loop must keep receiving meanwhile);
2. only then asks the transport to settle the group: no settle ever precedes the
   commit of its own record;
3. then gives back, for each copy, what it held: its lease in the cross-process
   guard first, then its turn (a twin of this process that takes the turn must find
   the lease free), then its slot (`give_back`, also used by a copy given up before
   it reached the committer).

A crash between 1 and 2 leaves copies the ledger recognises when they come back.
"""

from __future__ import annotations

import asyncio
from typing import Any

from onceq._core import faults
from onceq._core.entry import Entry
from onceq._core.handoff import Handoff
from onceq._core.hooks import Hooks
from onceq._core.inflight import Leases, Slots, Turns
from onceq._core.ledger_api import LedgerApi
from onceq._core.stats import Stats
from onceq._core.transport import HELD, Transport

__all__ = ["LEASE", "SLOT", "STOP", "TURN", "Committer"]

STOP = object()  # put last: the committer returns once it has settled what came before
# What a copy holds until it is settled and given back: its slot; + its turn; + its lease.
SLOT, TURN, LEASE = object(), object(), object()


class Committer:
    """The group commit and settle of one consumer (see the module docstring)."""

    def __init__(
        self,
        pending: Handoff,
        ledger: LedgerApi,
        transport: Transport,
        *,
        stats: Stats,
        leases: Leases,
        turns: Turns,
        slots: Slots,
        hooks: Hooks,
        max_group: int,
    ) -> None:
        self.pending = pending
        self.ledger = ledger
        self.transport = transport
        self.stats = stats
        self.leases = leases
        self.turns = turns
        self.slots = slots
        self.hooks = hooks
        self.max_group = max_group

    async def give_back(self, msg_id: str | None, leased: bool, turn: bool) -> None:
        """What a copy held, once it is settled (or given up): the lease first, then the
        turn, then its slot. `run` does the same inline for each settled copy."""
        if leased or turn:
            assert msg_id is not None  # a lease and a turn are taken only for an id
            if leased and not self.leases.release_now(msg_id):
                await self.leases.release(msg_id)
            if turn:
                self.turns.give_back(msg_id)
        self.slots.release()

    async def run(self) -> None:
        pending, max_group = self.pending, self.max_group
        stopping = False
        while not stopping:
            first = await pending.get()
            if first is STOP:
                return
            jobs: list[tuple[Entry, Any]] = [first]
            while len(jobs) < max_group and not pending.empty():
                item = pending.get_nowait()
                if item is STOP:
                    stopping = True
                    break
                jobs.append(item)
            group = [e for e, _ in jobs]
            faults.hit("before-commit")
            # The commit blocks on fsync; a thread keeps the loop receiving meanwhile.
            # A group of held copies only has nothing to record: no transaction.
            if any(e.kind is not HELD for e in group):
                await asyncio.to_thread(self.ledger.commit, group)
            faults.hit("after-commit-before-settle")  # the window recovery exists for
            # Settle only now: the records are durable.
            await self.transport.settle([(e.delivery, e.settle, e.reason) for e in group])
            # As `give_back`, inline (a coroutine per copy cost more than the release); a
            # hard stop cutting this short leaves the leases to `leases.aclose()`.
            stats, leases, turns, slots = self.stats, self.leases, self.turns, self.slots
            for e, held in jobs:
                stats.add(e)
                if held is not SLOT:
                    msg_id = e.delivery.msg_id
                    assert msg_id is not None  # a turn (and a lease) is taken only for an id
                    if held is LEASE and not leases.release_now(msg_id):
                        await leases.release(msg_id)
                    turns.give_back(msg_id)
                slots.release()
            if self.hooks.settled:  # one check per group
                self.hooks.emit_settled(group)
