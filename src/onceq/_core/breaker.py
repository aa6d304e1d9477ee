"""The circuit breaker of one flow: stop calling a partner that is down, probe, resume.

    closed ──K transient failures in a row, on K different messages──▶ open
    open ──probe time reached: one call allowed (the probe)──▶ half-open
    half-open ──the probe answered (success, or a rejection: the partner is up)──▶ closed
    half-open ──the probe failed transiently──▶ open (the next probe waits twice as long)

Why on different messages: one message failing over and over (its immediate retry, a
claim the partner answers BUSY) says something about that message, not that the
partner is down; K different messages failing in a row does. A success (or any
answer that is not a transient failure) ends the streak.

Why the held messages spend no attempt: they were never tried. They go back to the
queue (RELEASE), nothing is recorded, and a message never reaches its dead
letter because a partner was down while it waited.

Why the probe spends one: it is a real call, recorded like any other. Were it free,
a message that always fails transiently (a poisoned claim the partner answers 503)
would be picked as the probe again and again and hold the breaker open for ever;
spending its attempt moves it down its retry tiers to its dead letter, and the next
probe is another message.

Probe delay: `policy.probe`·2^k after the k-th failed probe in a row, capped at
`policy.max_probe`, and never shorter than the Retry-After of the failure that opened
(or re-opened) it: the partner said when to come back. Only the probe's outcome moves
a half-open breaker; outcomes of calls that started before it opened are stale and
only their Retry-After counts.

The clock is injected (`clock`, default time.monotonic), so every transition is tested
without sleeping. One WARNING line per state change, with the reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from onceq._core.retry import BreakerPolicy
from onceq._core.transport import TRANSIENT

if TYPE_CHECKING:
    from onceq._core.consumer import Outcome

log = logging.getLogger("onceq.breaker")  # the name in every log line: kept across moves

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"
# The log event of each change (onceq._core.logs.EVENTS): an alert keys on these names.
BREAKER_EVENTS = {OPEN: "breaker-open", HALF_OPEN: "breaker-half-open", CLOSED: "breaker-closed"}


def _seconds(s: float) -> str:
    return f"{s:g}s" if s < 10 else f"{s:.0f}s"


class Breaker:
    """The state machine; the consume loop asks `allow()` and tells `record()`.

    `on_change(old, new)` is called after each state change (the loop pauses,
    probes and resumes its transport from there).
    """

    def __init__(
        self,
        policy: BreakerPolicy,
        *,
        name: str,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[str, str], None] | None = None,
    ) -> None:
        self.policy = policy
        self.name = name
        self.clock = clock
        self.on_change = on_change
        self._state = CLOSED
        self._streak: set[str] = set()  # distinct msg_ids failing transiently in a row
        self._failed_probes = 0  # probes failed since it opened: the delay's exponent
        self._probe_at = 0.0  # when open: the clock time the next probe may start
        self._probe_id: str | None = None  # when half-open: the msg_id of the probe
        self._opened_at = 0.0
        self.opened = 0  # times it opened (closed → open), for reports and tests

    @property
    def closed(self) -> bool:
        """Calls may start (the loop's common case, answered without asking `allow`)."""
        return self._state == CLOSED

    @property
    def state(self) -> str:
        """'closed', 'open' or 'half-open'."""
        return self._state

    def probe_in(self) -> float | None:
        """Seconds until a probe may start (0: now); None unless open."""
        if self._state != OPEN:
            return None
        return max(0.0, self._probe_at - self.clock())

    def allow(self, msg_id: str | None = None) -> bool:
        """May a call start now? Closed: yes. Open: only the probe, once it is time
        (the breaker turns half-open and `msg_id` is the probe). Half-open: no, one
        probe at a time."""
        if self._state == CLOSED:
            return True
        if self._state == OPEN and self.clock() >= self._probe_at:
            self._probe_id = msg_id
            self._change(HALF_OPEN, "probing with one message")
            return True
        return False

    def record(self, msg_id: str | None, outcome: Outcome) -> None:
        """The outcome of a call the loop made (SUCCESS, REJECTED or TRANSIENT)."""
        transient = outcome.kind is TRANSIENT
        if self._state == HALF_OPEN and msg_id == self._probe_id:
            self._probe_id = None
            if transient:
                self._failed_probes += 1
                self._open(outcome, f"the probe failed ({outcome.reason})")
            else:
                # Any answer that is not a transient failure (a success, a 409, a 422)
                # says the partner is up again.
                open_for = self.clock() - self._opened_at
                self._streak.clear()
                self._failed_probes = 0
                self._change(CLOSED, f"the probe was answered after {open_for:.1f}s open")
            return
        if self._state != CLOSED:
            # A call that started before it opened: stale as evidence either way, but
            # a Retry-After it brings still pushes the next probe back.
            if transient and self._state == OPEN and outcome.retry_after:
                self._probe_at = max(self._probe_at, self.clock() + outcome.retry_after)
            return
        if not transient:
            self._streak.clear()
            return
        if msg_id is not None:
            self._streak.add(msg_id)
        if len(self._streak) >= self.policy.failures:
            self._opened_at = self.clock()
            self.opened += 1
            self._open(
                outcome,
                f"after {len(self._streak)} transient failures in a row ({outcome.reason})",
            )

    def _open(self, outcome: Outcome, why: str) -> None:
        p = self.policy
        delay = min(p.probe * 2**self._failed_probes, p.max_probe)
        # The partner's own word (Retry-After) wins over our guess, even past
        # max_probe: a probe before it would only be refused again.
        delay = max(delay, outcome.retry_after or 0.0)
        self._probe_at = self.clock() + delay
        self._streak.clear()
        self._change(OPEN, f"{why}; probing in {_seconds(delay)}")

    def _change(self, new: str, why: str) -> None:
        old, self._state = self._state, new
        word = {OPEN: "open" if old == CLOSED else "open again", HALF_OPEN: "half-open"}
        sep = " " if why.startswith("after") else ": "
        log.warning(
            "flow %s: breaker %s%s%s",
            self.name,
            word.get(new, new),
            sep,
            why,
            extra={"event": BREAKER_EVENTS.get(new, "breaker-open"), "flow": self.name or None},
        )
        if self.on_change is not None:
            self.on_change(old, new)
