"""What happens after a transient failure: the retry policy and the breaker's settings.

    try → (immediate retries) → delayed tiers (5 s, 30 s, 2 min, 10 min) → dead

A transient failure (a 503, a timeout, a refused connection, `Retry`) is tried again
at once `immediate` times, then after each delay of `delays` in turn, then it is
dead. The attempt is counted durably in the ledger (the failures it holds for the
msg_id since its last replay, plus this one), so a crash never resets it.

Why tiers and not one delay per message: RabbitMQ expires a per-message TTL only at
the head of a queue, so a 5 s message would wait behind a 10 min one. A queue per
delay, each with one queue-level TTL, keeps every delay exact without a plugin.

`RetryPolicy.exercise()` is the exercises' rule (one immediate retry, then dead);
`RetryPolicy.none()` dead-letters at the first failure (the orders preset, whose
only effect is the ledger row). `BreakerPolicy` holds the circuit breaker's
settings; its state machine is `onceq._core.breaker`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from onceq._core.transport import (
    ACK,
    DEAD,
    DELAY,
    DUPLICATE,
    HELD,
    REJECTED,
    RELEASE,
    REQUEUE,
    SUCCESS,
    Kind,
    Settle,
)
from onceq.errors import UsageError

# The default tiers: short enough that a blip of a few seconds costs 5 s, long enough
# that a partner restarting or failing over (minutes) is waited for before anything
# is dead.
DEFAULT_DELAYS = (5.0, 30.0, 120.0, 600.0)

# The longest Retry-After honoured (a partner's header, `Retry(after=…)`): a partner
# that says "come back next month" (or a bug that says 10^12 seconds) must not park a
# message where no one looks for it. The retry policy still never waits longer than
# its longest tier.
RETRY_AFTER_CAP = 86_400.0

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*")


def parse_duration(text: str | float | int, what: str = "duration") -> float:
    """'5s', '2m', '500ms', '1.5h', '30' (seconds) → seconds; UsageError naming `what`."""
    if isinstance(text, bool):
        raise UsageError(f"{what}: {text!r}: not a duration (e.g. 5s, 2m, 500ms)")
    if isinstance(text, int | float):
        value = float(text)
    else:
        m = _DURATION.fullmatch(text)
        if m is None:
            raise UsageError(f"{what}: {text!r}: not a duration (e.g. 5s, 2m, 500ms)")
        value = float(m.group(1)) * _UNITS[m.group(2) or "s"]
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{what}: {text!r}: must be a finite duration, 0 or more")
    return value


def delay_label(seconds: float) -> str:
    """The shortest exact name of a delay: 5s, 2m, 1h, 500ms (names a retry queue)."""
    ms = round(seconds * 1000)
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


@dataclass(frozen=True)
class RetryPolicy:
    """`immediate` retries at once, then one try after each of `delays` (seconds)."""

    immediate: int = 1
    delays: tuple[float, ...] = DEFAULT_DELAYS

    def __post_init__(self) -> None:
        if isinstance(self.immediate, bool) or not isinstance(self.immediate, int):
            raise UsageError(f"retry: immediate must be a whole number, not {self.immediate!r}")
        if not 0 <= self.immediate <= 100:
            raise UsageError(f"retry: immediate must be 0-100, not {self.immediate}")
        delays = tuple(parse_duration(d, "retry delay") for d in self.delays)
        if any(d <= 0 for d in delays):
            raise UsageError("retry: every delay must be more than 0 (use immediate for 0)")
        if len(delays) > 20:
            raise UsageError(f"retry: at most 20 delays, not {len(delays)}")
        labels = [delay_label(d) for d in delays]
        if len(set(labels)) != len(labels):
            raise UsageError("retry: two delays are the same (each names its own retry queue)")
        object.__setattr__(self, "delays", delays)

    @classmethod
    def exercise(cls) -> RetryPolicy:
        """The exercises' rule: one immediate retry, then dead."""
        return cls(immediate=1, delays=())

    @classmethod
    def none(cls) -> RetryPolicy:
        """No retry: the first failure is dead (a queue whose only effect is the ledger)."""
        return cls(immediate=0, delays=())

    @classmethod
    def named(cls, name: str) -> RetryPolicy:
        """'default', 'exercise' or 'none' (the --retry option, a flow file's retry = "…")."""
        policies: dict[str, Callable[[], RetryPolicy]] = {
            "default": cls,
            "exercise": cls.exercise,
            "none": cls.none,
        }
        if name not in policies:
            raise UsageError(f"retry: {name!r}: not a policy (default, exercise or none)")
        return policies[name]()

    @property
    def max_attempts(self) -> int:
        return 1 + self.immediate + len(self.delays)

    @property
    def longest(self) -> float:
        """The longest delay (0 without tiers): how long a message may wait to be tried."""
        return max(self.delays, default=0.0)

    def decide(
        self, kind: Kind, attempt: int, retry_after: float | None = None
    ) -> tuple[Settle, float]:
        """(settle, delay) for an outcome at durable attempt `attempt` (1 = first try).

        | kind       | attempt ≤ 1+immediate | then, while tiers remain  | last attempt |
        | SUCCESS    | ACK                   | ACK                       | ACK          |
        | DUPLICATE  | ACK                   | ACK                       | ACK          |
        | REJECTED   | DEAD                  | DEAD                      | DEAD         |
        | TRANSIENT  | REQUEUE               | DELAY delays[attempt-…]   | DEAD         |
        | HELD       | RELEASE (never tried: no attempt spent)                          |

        A `retry_after` (a partner's Retry-After, a `Retry(after=…)`) skips what is
        shorter: an immediate retry becomes a delay, and the delay is the first tier
        at least that long (the longest tier when none is; it never adds attempts).
        """
        if kind in (SUCCESS, DUPLICATE):
            return ACK, 0.0
        if kind is HELD:
            return RELEASE, 0.0
        if kind is REJECTED or attempt >= self.max_attempts:
            return DEAD, 0.0
        tier = attempt - 1 - self.immediate  # index of the tier this failure goes to
        if retry_after and retry_after > 0 and self.delays:
            tier = max(tier, 0)
            while tier < len(self.delays) - 1 and self.delays[tier] < retry_after:
                tier += 1
        if tier < 0:
            return REQUEUE, 0.0
        return DELAY, self.delays[tier]


@dataclass(frozen=True)
class BreakerPolicy:
    """The circuit breaker of one flow (state machine: `onceq._core.breaker`).

    After `failures` consecutive transient failures of the call effect on different
    messages the breaker opens: no new call starts, and the messages held go back to
    the queue without spending an attempt (they failed because the partner is down,
    not because of themselves). One message probes after `probe` seconds, then after
    twice that, … up to `max_probe`; a success closes it.
    """

    enabled: bool = True
    failures: int = 5
    probe: float = 1.0
    max_probe: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.failures, bool) or not isinstance(self.failures, int):
            raise UsageError(f"breaker: failures must be a whole number, not {self.failures!r}")
        if not 1 <= self.failures <= 10_000:
            raise UsageError(f"breaker: failures must be 1-10000, not {self.failures}")
        probe = parse_duration(self.probe, "breaker probe")
        max_probe = parse_duration(self.max_probe, "breaker max probe")
        if probe <= 0:
            raise UsageError("breaker: probe must be more than 0")
        if max_probe < probe:
            raise UsageError("breaker: max probe must be at least the first probe delay")
        object.__setattr__(self, "probe", probe)
        object.__setattr__(self, "max_probe", max_probe)

    @classmethod
    def off(cls) -> BreakerPolicy:
        return cls(enabled=False)
