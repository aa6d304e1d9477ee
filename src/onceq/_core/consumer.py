"""The one consume loop: receive → decode → ledger → handler → decide → record → settle.

Both transports run through `Consumer.run`. The ordering below is the whole
reliability argument, so it lives in one place:

1. A delivery is decoded; a message that cannot be decoded is rejected at once
   (retrying a parse error fails the same way and blocks the queue behind it).
2. At most one copy of a msg_id is in flight in this process: a second copy waits for
   the first to be recorded and settled (its turn)...
3. ...and at most one across processes: the copy then claims msg_id's lease in the
   in-flight guard (`onceq._core.inflight`: an advisory lock on PostgreSQL, a byte-range
   lock beside an SQLite file), waiting while a twin in another process holds it.
4. Only then the duplicate check (PostgreSQL's guard does it after the lock, in the
   claim's round trip): if the ledger holds the msg_id (a twin committed it, maybe
   while this copy waited), no handler call. So a partner is never called twice at
   once for one message. When the ledger row is the whole effect (`no_effect`, the
   directory queue) steps 2 to 4 are skipped: there is no call to save, and the
   primary key in the commit tells a second copy from the first, even in one group.
5. The handler's outcome becomes a settle decision (`RetryPolicy.decide`).
6. The committer (`onceq._core.committer`) writes a group of outcomes in one durable
   transaction, and only then asks the transport to settle that group; then the
   lease is released. A crash
   before the commit leaves every copy unsettled (it comes back and runs again, the
   primary key refusing a second effect; its lease died with the process); a crash
   after the commit and before the settle leaves copies that the ledger recognises.

Grouping is the main speed trick: many outcomes share one commit (one fsync) and
one settle, but no settle ever precedes the commit of its own record.

Copies are HELD (settled RELEASE: nothing recorded, no attempt spent) and the transport
paused while the breaker is open or the ledger away: `onceq._core.holds`. Each verdict
goes to the misconfiguration guard (`onceq._core.misconfig`): once it trips, nothing more
is taken or called, undecided copies are HELD, calls under way stand.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from onceq._core.committer import LEASE, SLOT, STOP, TURN, Committer
from onceq._core.effect import effect_raised
from onceq._core.entry import Entry
from onceq._core.handoff import Handoff
from onceq._core.holds import Holds
from onceq._core.hooks import Hooks
from onceq._core.inflight import Checked, InflightGuard, Leases, Slots, Turns, guard_for
from onceq._core.ledger_api import LedgerApi
from onceq._core.misconfig import GUARD_HELD, MisconfigGuard
from onceq._core.outcome import Decoder, Handler, Outcome, decode_safely, no_effect
from onceq._core.retry import BreakerPolicy, RetryPolicy
from onceq._core.stats import COUNTS, Stats
from onceq._core.transport import (
    ACK,
    DUPLICATE,
    HELD,
    REJECTED,
    SUCCESS,
    TRANSIENT,
    Delivery,
    Transport,
)
from onceq.errors import LedgerUnavailable

__all__ = ["COUNTS", "Consumer", "Decoder", "Handler", "Outcome", "Stats", "no_effect"]

log = logging.getLogger("onceq.consumer")  # the name in every log line: kept across moves


_UNCHECKED = object()  # `_effect`: the ledger not asked yet


class Consumer:
    """Runs `transport` into `ledger` until the transport has no more deliveries.

    `max_in_flight` bounds deliveries being handled at once (for a broker, the
    prefetch: the broker bounds it too); `max_group` bounds one commit.
    `on_settled` is called with each settled group (progress display). `retry`: what a
    transient failure leads to; `breaker`: the circuit breaker's policy, built into
    `self.breaker` (None when off or without a call). `inflight` makes the ledger's
    cross-process guard (default `onceq._core.inflight.guard_for`: the ledger's own;
    None from it: no guard); `run`
    opens it when there is a call, and closes it when it ends.

    Two ways to end, deliberately different:
    - the transport runs out (an empty directory queue, a drained broker queue, a
      transport stopped directly with `transport.stop()`): every delivery already
      received is handled, recorded and settled before `run` returns;
    - `Consumer.stop()` (a signal, a deadline, a failure): no new handler call
      starts; calls under way finish and are settled; copies received but not yet
      called are left unsettled (a broker returns them when the channel closes, a
      directory queue's next run recovers them) and the ledger decides next time.
    """

    def __init__(
        self,
        transport: Transport,
        ledger: LedgerApi,
        decode: Decoder,
        handler: Handler = no_effect,
        *,
        max_in_flight: int = 256,
        max_group: int = 512,
        max_attempts: int | None = None,
        on_settled: Callable[[Sequence[Entry]], None] | None = None,
        retry: RetryPolicy | None = None,
        breaker: BreakerPolicy | None = None,
        inflight: Callable[[LedgerApi], InflightGuard | None] = guard_for,
        guard: MisconfigGuard | None = None,
    ) -> None:
        self.transport = transport
        self.ledger = ledger
        self.decode = decode
        self.handler = handler
        self.max_group = max_group
        # What a transient failure leads to. Without a policy, `max_attempts` tries
        # with no delay between them (the exercises' rule: 2); the transport may say
        # what it can do (`transport.max_attempts`).
        if retry is None:
            tries = (
                max_attempts if max_attempts is not None else getattr(transport, "max_attempts", 2)
            )
            retry = RetryPolicy(immediate=max(tries, 1) - 1, delays=())
        self.retry = retry
        self.max_attempts = retry.max_attempts
        self.breaker_policy = breaker if breaker is not None else BreakerPolicy.off()
        self.holds = Holds(transport, ledger, self.breaker_policy, calls=handler is not no_effect)
        self.breaker = self.holds.breaker
        self.leases = Leases(inflight)  # opened by `run` when there is a call
        # What the loop tells its watchers (onceq._core.hooks): `on_settled` is one more
        # subscriber of the settled groups.
        self.hooks = Hooks()
        if on_settled is not None:
            self.hooks.settled.append(on_settled)
        self.guard = guard  # the misconfiguration guard (None: off)
        self.stats = Stats()
        self.max_in_flight = max_in_flight
        self._slots = Slots(max_in_flight)
        # (entry, what to give back after its settle: SLOT, TURN or LEASE) or STOP.
        self._pending = Handoff()
        self._tasks: set[asyncio.Task[None]] = set()  # the handler tasks under way
        self._turns = Turns()  # one copy of a msg_id in flight in this process
        self._committer = Committer(
            self._pending, ledger, transport, stats=self.stats, leases=self.leases,
            turns=self._turns, slots=self._slots, hooks=self.hooks, max_group=max_group,
        )  # fmt: skip
        self._failure: BaseException | None = None
        # Set by stop() only. The end of deliveries() is NOT a stop: a directory queue's
        # iteration ends as soon as its inbox is empty, before the handler tasks of the
        # last files have even started, and those must still be handled and settled.
        self._stopped = False

    async def run(self) -> Stats:
        if self.handler is not no_effect:
            self.leases.open(self.ledger)
        committer = asyncio.create_task(self._committer.run(), name="onceq-committer")
        committer.add_done_callback(self._stop_on_error)
        tasks = self._tasks
        # The loop's own create_task: asyncio.create_task is one Python frame more per
        # message to look the loop up again.
        create_task = asyncio.get_running_loop().create_task
        self.holds.start(self._stop_on_error)
        try:
            async for delivery in self.transport.deliveries():
                if not (self._slots.take_now() or await self._slots.take(committer)):
                    break  # the committer ended (a ledger error): stop taking work
                if committer.done():  # the ledger failed: stop taking work
                    self._slots.release()
                    break
                self.stats.received += 1
                if self.handler is no_effect:
                    # The ledger row is the whole effect: there is no call to wait for
                    # and no partner to protect from two copies at once, so the entry
                    # goes straight to the committer (no task, no events). The primary
                    # key in the commit still tells a second copy from the first, also
                    # two copies inside one group; the slot is freed after the settle.
                    decided = self._judged(
                        delivery, decode_safely(self.decode, delivery), called=False
                    )
                    entry = self._entry(delivery, decided)
                    self._pending.put_nowait((entry, SLOT))
                    continue
                t = create_task(self._handle(delivery))
                tasks.add(t)
                t.add_done_callback(self._stop_on_error)  # also drops it from `tasks`
            # Wait for the handlers, but wake at once if the committer dies (ledger error).
            while tasks:
                done, _ = await asyncio.wait(
                    [*tasks, committer], return_when=asyncio.FIRST_COMPLETED
                )
                for t in done:
                    if not t.cancelled() and (exc := t.exception()) is not None:
                        raise exc
            if self._failure is not None:  # a handler task failed and is gone from `tasks`
                raise self._failure
            self._pending.put_nowait(STOP)
            await committer
        finally:
            for t in (*tasks, committer):
                t.cancel()
            self.holds.close()
            await self.leases.aclose()
        return self.stats

    @property
    def in_flight(self) -> int:
        """Deliveries received and not yet settled (or given up at a stop): the slots taken."""
        return self._slots.taken

    @property
    def stopping(self) -> bool:
        """`stop()` was called: no new call starts (a health check answers 503)."""
        return self._stopped

    def stop(self) -> None:
        """A real stop (signal, deadline): take nothing more, start no new handler call.

        Calls under way finish and are recorded and settled; see the class docstring.
        Safe to call more than once and from a signal handler on the loop.
        """
        self._stopped = True
        self.hooks.emit_state("stopping")
        self.holds.stop()  # copies waiting for a probe or the ledger: a stop does not wait
        self.leases.stop()  # a copy waiting for a twin elsewhere starts no call
        # A commit waiting for a lost ledger to come back gives up (LedgerError): its
        # copies stay unsettled and come back; the ledger decides then.
        self.ledger.interrupt()
        self.transport.stop()

    def _stop_on_error(self, task: asyncio.Task[None]) -> None:
        """A failed handler task or committer ends the receiving at once.

        Otherwise a transport that waits for its outstanding deliveries to settle
        (or for new messages) would wait forever; the failure is raised by `run`.
        The one done-callback of a handler task: it also leaves `_tasks` here.
        """
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            if self._failure is None:
                self._failure = task.exception()
            self.stop()

    async def _handle(self, d: Delivery) -> None:
        turn = False
        leased = False
        handed = False  # to the committer, which gives the lease, turn and slot back
        try:
            decoded = decode_safely(self.decode, d)
            if decoded.kind is SUCCESS:
                assert d.msg_id is not None, "a decoder that succeeds sets delivery.msg_id"
                if not self._turns.try_take(d.msg_id):  # a twin of this process holds it
                    await self._turns.take(d.msg_id)
                turn = True
                if self.leases.claim_now(d.msg_id):  # free: no coroutine on the way
                    leased, checked = True, None
                else:
                    leased, checked = await self.leases.claim(d.msg_id)
                if self._stopped:
                    # Stopped while this copy waited behind its twin (or before it
                    # began): start no new call after a stop. It is left unsettled: a
                    # broker returns it to the queue when the channel closes, a
                    # directory queue's next run recovers it; the ledger decides then.
                    return
                outcome = await self._effect(d, decoded, checked)
                if outcome is None:
                    return  # stopped while held: unsettled, as above
                outcome = self._judged(d, outcome, called=True)
            else:
                outcome = self._judged(d, decoded, called=False)
            # The task ends here: the committer records, settles, then gives back what
            # it holds (`Committer.give_back`): no future per copy, no wake-up after
            # its settle.
            self._pending.put_nowait(
                (self._entry(d, outcome), LEASE if leased else TURN if turn else SLOT)
            )
            handed = True
        finally:
            if not handed:
                await self._committer.give_back(d.msg_id, leased, turn)

    async def _effect(
        self, d: Delivery, decoded: Outcome, checked: Checked | None
    ) -> Outcome | None:
        """The call's outcome; HELD when none may start (the breaker is open, the ledger
        away); None when stopped. `checked`: the guard's duplicate check, if it did one."""
        assert d.msg_id is not None
        if self.guard is not None and self.guard.stopped:
            return Outcome(HELD, GUARD_HELD)  # no call after the guard's stop
        # Without the guard's answer, the ledger's read: one per tick of the loop for
        # every copy that asks in it (`aprocessed_ref`; PostgreSQL: one round trip).
        # The answer as a plain value: a frozen `Checked` per message cost ~1.5k
        # instructions for nothing.
        ref = checked.ref if checked is not None else _UNCHECKED
        while ref is _UNCHECKED:
            try:
                # After the lease either way: a twin that committed meanwhile is found.
                ref = await self.ledger.aprocessed_ref(d.msg_id)
            except LedgerUnavailable as exc:
                # Nothing can be checked, so nothing is called: held untried, and the
                # transport paused until the ledger answers (onceq._core.holds).
                self.holds.ledger_lost(exc)
                if self.holds.pausable:
                    return Outcome(HELD, "ledger-unavailable")
                if not await self.holds.ledger_back():
                    return None
        if ref is not None:
            # Before the breaker: a duplicate makes no call, so it can never be the
            # probe (a probe that is never answered would hold the breaker half-open).
            return Outcome(DUPLICATE, fields=decoded.fields)
        if self._stopped:  # while the check was answered: no new call after a stop
            return None
        breaker = self.breaker
        if breaker is not None and not breaker.closed and not await self.holds.allowed(d.msg_id):
            return None if self._stopped else Outcome(HELD, "breaker-open")
        timed = self.hooks.call_ended  # an empty list costs one check, as no watcher
        started = time.perf_counter() if timed else 0.0
        try:
            outcome = await self.handler(d, decoded.fields)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in a handler must not take the message with it
            outcome = effect_raised(d, exc)  # one line, no traceback: onceq._core.effect
        if timed:  # the call only: not the ledger read, not a wait for a turn
            elapsed = time.perf_counter() - started
            for fn in timed:
                fn(elapsed)
        if self.breaker is not None:
            self.breaker.record(d.msg_id, outcome)
        return outcome

    def _judged(self, d: Delivery, o: Outcome, *, called: bool) -> Outcome:
        """The verdict, seen by the guard. After its trip a verdict reached without a
        call is not taken (HELD: back untouched); a call's stands (the partner answered).
        """
        guard = self.guard
        if guard is None:
            return o
        if guard.stopped:  # here, or by a sibling process: take nothing more
            if not self.stats.misconfigured:
                self._guard_stop(guard)
            return o if called else Outcome(HELD, GUARD_HELD)
        if guard.feed(o.kind, o.reason, o.detail, d.body):
            self._guard_stop(guard)
        return o

    def _guard_stop(self, guard: MisconfigGuard) -> None:
        self.stats.misconfigured = guard.hint()
        self.hooks.emit_state("misconfigured")
        self.transport.stop()  # claim nothing more; what is held is settled

    def _entry(self, d: Delivery, o: Outcome) -> Entry:
        if o.kind is SUCCESS:
            # Nearly every copy: `retry.decide` answers ACK for any SUCCESS, and there
            # is no attempt to count; its call and the checks below, skipped.
            d.delay = 0.0
            return Entry(
                d, SUCCESS, ACK, o.reason, o.detail, 1, o.fields,
                max_attempts=self.max_attempts, policy=self.retry,
            )  # fmt: skip
        attempt = 1
        if o.kind in (REJECTED, TRANSIENT) and d.msg_id is not None:
            try:
                attempt = self.ledger.failed_attempts(d.msg_id) + 1
            except LedgerUnavailable as exc:
                # Its attempts cannot be counted, so its failure cannot be decided:
                # given back unrecorded (it comes back and is tried again: at worst a
                # second call for a failure) rather than decided on a guess.
                self.holds.ledger_lost(exc)
                o = Outcome(HELD, "ledger-unavailable")
        settle, d.delay = self.retry.decide(o.kind, attempt, o.retry_after)
        return Entry(
            d,
            o.kind,
            settle,
            o.reason,
            o.detail,
            attempt,
            o.fields,
            max_attempts=self.max_attempts,
            policy=self.retry,
        )
