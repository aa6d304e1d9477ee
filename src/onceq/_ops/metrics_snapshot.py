"""What /metrics and /healthz read of a consumer: plain numbers, no Prometheus in them.

A `Snapshot` per consumer (its `Stats`, in flight, breaker, call durations, problem),
summed per flow by `FlowMetrics.total`; the collector (onceq._ops.metrics) turns the sum
into samples at each scrape. Kept apart from the collector so a run without
--metrics-port (and `onceq dirq lag`) never loads prometheus_client, and so a --workers
child can send its snapshot to the parent as plain data (`snapshot_dict`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from onceq._core.breaker import CLOSED, OPEN
from onceq._core.stats import OUTCOMES, Stats

__all__ = [
    "BUCKETS",
    "DONE",
    "Durations",
    "FlowMetrics",
    "Snapshot",
    "healthy",
    "snapshot_dict",
    "snapshot_from_dict",
]

# Seconds: Prometheus's default buckets, which fit an HTTP call (5 ms to 10 s, the
# default timeout).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


class Durations:
    """A histogram of call durations: per-bucket counts (the last: above every bound).

    Plain ints, so a --workers child can send its counts to the parent, which adds
    them (`merge`) and serves the sum.
    """

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bucket (le = "<=").
        self.counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.sum += seconds

    def merge(self, other: Durations) -> None:
        for i, n in enumerate(other.counts):
            self.counts[i] += n
        self.sum += other.sum

    def as_dict(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "sum": self.sum}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Durations:
        out = cls()
        out.counts = [int(n) for n in d["counts"]]
        out.sum = float(d["sum"])
        return out

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative (le, count) pairs, +Inf last: the text format's histogram."""
        out, total = [], 0
        for bound, n in zip((*BUCKETS, float("inf")), self.counts, strict=True):
            total += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(total)))
        return out


@dataclass
class Snapshot:
    """What one consumer (or a --workers child's last report) shows at a scrape."""

    stats: Stats
    in_flight: int = 0
    breaker: str | None = None  # closed | open | half-open; None: no breaker
    durations: Durations | None = None  # None: the flow makes no call
    problem: str | None = None  # why it is not healthy (None: healthy)


# A consumer whose run is over (healthy: see FlowMetrics.total).
DONE = "done"


def healthy(problem: str | None) -> bool:
    return problem is None or problem == DONE


@dataclass
class FlowMetrics:
    """One flow's sources of numbers: its consumers' snapshots and its queue reader."""

    name: str
    snapshots: list[Callable[[], Snapshot]] = field(default_factory=list)
    queue: Any = None  # onceq._ops.metrics_queues reader: .messages(), .oldest_age()

    def total(self) -> Snapshot:
        """Every consumer of this flow summed (onceq run's dirq workers, --workers)."""
        total = Snapshot(Stats())
        states = []
        problems = []
        for read in self.snapshots:
            s = read()
            _add_stats(total.stats, s.stats)
            total.in_flight += s.in_flight
            if s.breaker is not None:
                states.append(s.breaker)
            if s.durations is not None:
                if total.durations is None:
                    total.durations = Durations()
                total.durations.merge(s.durations)
            if s.problem is not None:
                problems.append(s.problem)
        if states:
            # Several consumers of one flow: the worst state shows (one open breaker
            # means the partner is failing someone).
            total.breaker = max(states, key=lambda st: (st != CLOSED, st == OPEN))
        # A consumer whose run ended normally (a drained --until-empty flow, a finished
        # --workers child) is no problem while the others work: one flow done must not
        # make a liveness probe kill a batch whose other flows are still running.
        real = [p for p in problems if p != DONE]
        total.problem = real[0] if real else None
        if self.snapshots and len(problems) == len(self.snapshots) and not real:
            total.problem = DONE
        if not self.snapshots:
            total.problem = "starting"  # expected, its consumer not up yet
        return total


def snapshot_dict(s: Snapshot) -> dict[str, Any]:
    """A snapshot as plain data: what a --workers child sends its parent."""
    return {
        "stats": s.stats.as_dict(),
        "dead_word": s.stats.dead_word,
        "in_flight": s.in_flight,
        "breaker": s.breaker,
        "durations": s.durations.as_dict() if s.durations is not None else None,
        "problem": s.problem,
    }


def snapshot_from_dict(d: dict[str, Any]) -> Snapshot:
    stats = Stats(dead_word=d["dead_word"])
    stats.merge(d["stats"])
    durations = d["durations"]
    return Snapshot(
        stats,
        d["in_flight"],
        d["breaker"],
        Durations.from_dict(durations) if durations is not None else None,
        d["problem"],
    )


def _add_stats(into: Stats, s: Stats) -> None:
    for key in (*OUTCOMES, "received"):
        setattr(into, key, getattr(into, key) + getattr(s, key))
    into.reasons.update(s.reasons)
    into.requeued_reasons.update(s.requeued_reasons)
