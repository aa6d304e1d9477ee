"""Holding copies untried: why a consume loop pauses its transport, and what ends it.

Two things make the loop give copies back untried (`Kind.HELD`, settled RELEASE:
nothing recorded, no attempt spent, since the message did nothing wrong) and stop
the transport from handing out more:

- the circuit breaker is open (`onceq._core.breaker`): the partner is down. While it is
  open a due probe asks the paused transport for one copy; that copy's call is the
  probe, and its answer closes the breaker (or keeps it open, the next probe later).
- the ledger is away (`LedgerUnavailable` from a read: a lost PostgreSQL connection).
  Nothing can be checked for a duplicate or have its attempts counted, so nothing is
  called. The ledger's `ping()` is asked every 0.5 s (in a thread: it may wait for a
  connect timeout); when it answers, the transport resumes. Its own commit reconnects
  by itself meanwhile (the committer's group waits in its thread, unsettled).

Pausing is what keeps either from costing a redelivery storm: what the transport had
handed out goes back once and no more comes, so an outage costs no CPU. The transport
is paused while at least one reason holds and resumed when the LAST one ends: a
breaker that closes while the ledger is still away does not resume it.

A transport without pause/probe/resume still works: the loop then keeps the copies it
may not call waiting here (bounded by max_in_flight) instead of giving them back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from onceq._core.breaker import CLOSED, OPEN, Breaker
from onceq._core.ledger_api import LedgerApi
from onceq._core.retry import BreakerPolicy
from onceq._core.waits import wait

log = logging.getLogger("onceq.holds")  # the name in every log line: kept across moves

BREAKER, LEDGER = "breaker", "ledger"
PING_EVERY_S = 0.5


class Holds:
    """The pause reasons of one loop, the breaker (None when off or without a call),
    and the tasks that end each reason: the prober, the ledger's watcher."""

    def __init__(
        self, transport: Any, ledger: LedgerApi, policy: BreakerPolicy, *, calls: bool
    ) -> None:
        self.transport = transport
        self.ledger = ledger
        self.policy = policy
        # Only a call can find a partner down: without one (the ledger row is the
        # effect) there is nothing to protect and no breaker.
        self.breaker: Breaker | None = None
        if policy.enabled and calls:
            self.breaker = Breaker(policy, name=ledger.flow, on_change=self._breaker_changed)
        self.pausable = all(
            callable(getattr(transport, m, None)) for m in ("pause", "probe", "resume")
        )
        self._reasons: set[str] = set()
        self._wake = asyncio.Event()  # set (and replaced) on any change or a stop
        self.stopped = False
        self._tasks: list[asyncio.Task[None]] = []
        self._on_done: Any = lambda _task: None
        self.ledger_losses = 0  # times the ledger went away during this run

    def start(self, on_done: Any) -> None:
        """Start the prober (a breaker and a pausable transport); `on_done` is called
        with each task of ours that ends (the loop stops on an error in one)."""
        if self.breaker is not None and self.pausable:
            self._spawn(self._drive_probes(), "onceq-prober", on_done)
        self._on_done = on_done

    def stop(self) -> None:
        """A stop: copies waiting here give up at once (a stop does not wait for a
        probe or for the ledger)."""
        self.stopped = True
        self._wake_up()

    def close(self) -> None:
        # Stopped too, not only cancelled: each task's loop ends on `stopped`, so a
        # task that lost its cancel (see `wait`) still ends at its next wake.
        self.stopped = True
        for t in self._tasks:
            t.cancel()
        self._wake_up()

    def _spawn(self, coro: Any, name: str, on_done: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        task.add_done_callback(on_done)
        self._tasks.append(task)

    def _hold(self, reason: str) -> None:
        if not self._reasons and self.pausable:
            self.transport.pause()
        self._reasons.add(reason)

    def _unhold(self, reason: str) -> None:
        if reason not in self._reasons:
            return
        self._reasons.discard(reason)
        if not self._reasons and self.pausable:
            self.transport.resume()

    def _wake_up(self) -> None:
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    # --- the breaker ------------------------------------------------------------------

    async def allowed(self, msg_id: str) -> bool:
        """May this copy's call start? Held at once when the transport pauses; else it
        waits here until the breaker lets it (the probe, or closed) or a stop."""
        assert self.breaker is not None
        while not self.breaker.allow(msg_id):
            if self.pausable or self.stopped:
                return False
            await wait(self._wake, self.breaker.probe_in())
        return True

    def _breaker_changed(self, old: str, new: str) -> None:
        if new == OPEN and old == CLOSED:
            self._hold(BREAKER)
        elif new == CLOSED:
            self._unhold(BREAKER)
        self._wake_up()

    async def _drive_probes(self) -> None:
        """While the breaker is open, ask the paused transport for one copy when a
        probe is due; that copy's call is the probe (`allowed`). Asked again after
        `policy.probe` when none came or it made no call (an empty queue, a copy
        the ledger already holds, a copy held because the ledger is away)."""
        assert self.breaker is not None
        while not self.stopped:
            wake, wait_s = self._wake, self.breaker.probe_in()
            if wait_s is None or wait_s > 0:  # closed or half-open (None), or not yet time
                await wait(wake, wait_s)
                continue
            self.transport.probe()
            await wait(wake, self.policy.probe)

    # --- the ledger -------------------------------------------------------------------

    @property
    def ledger_away(self) -> bool:
        return LEDGER in self._reasons

    def ledger_lost(self, exc: BaseException) -> None:
        """A read found the ledger away: pause until its ping answers (once per loss)."""
        if self.ledger_away:
            return
        self.ledger_losses += 1
        log.warning(
            "ledger %s unavailable (%s); holding messages until it answers",
            self.ledger.path,
            type(exc).__name__,
            extra={"event": "ledger-lost"},
        )
        self._hold(LEDGER)
        self._spawn(self._watch_ledger(time.monotonic()), "onceq-ledger-watch", self._on_done)

    async def ledger_back(self) -> bool:
        """Wait until the ledger answers again (True) or a stop (False): for a
        transport that cannot pause, whose copies wait here instead."""
        while self.ledger_away and not self.stopped:
            await wait(self._wake, None)
        return not self.stopped

    async def _watch_ledger(self, since: float) -> None:
        while not self.stopped:
            await wait(self._wake, PING_EVERY_S)
            if await asyncio.to_thread(self.ledger.ping):
                break
        if self.stopped:
            return
        log.warning(
            "ledger %s answers again after %.1f s; taking messages again",
            self.ledger.path,
            time.monotonic() - since,
            extra={"event": "ledger-back"},
        )
        self._unhold(LEDGER)
        self._wake_up()
