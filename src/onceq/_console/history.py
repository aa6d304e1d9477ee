"""The console's rates: done, duplicates, retried and dead per minute, with a sparkline.

The ledger's counts are totals; the console samples them each time the flows are
read (at most every MIN_GAP seconds, however many pages poll) and keeps WINDOW seconds
of samples per flow. A rate per minute is the difference between the newest sample
and the oldest one at least a minute old (or the oldest there is), scaled to a
minute; a count that went down (a replay, a prune) counts 0. The sparkline is the
done count added between consecutive samples, the last SPARK of them.
"""

from __future__ import annotations

import time
from collections import deque
from itertools import pairwise
from typing import Any

WINDOW = 600.0  # s of samples kept
MIN_GAP = 1.0  # s: samples closer than this replace the newest one
SPARK = 30
# rate name -> the ledger count it is the derivative of.
COUNTS = ("processed", "duplicates", "retried", "dead")
RATE_NAMES = {"processed": "done", "duplicates": "duplicate", "retried": "retried", "dead": "dead"}


def counts_of(ledger: dict[str, Any]) -> dict[str, int]:
    return {
        "processed": int(ledger["processed"]),
        "duplicates": int(ledger["duplicates"]),
        "retried": int(ledger.get("retried", 0)),
        "dead": int(ledger["dead"]),
    }


class History:
    """Samples of every flow's ledger counts; `add` one, `rates` of a flow."""

    def __init__(self) -> None:
        self._samples: dict[str, deque[tuple[float, dict[str, int]]]] = {}

    def add(self, flow: str, ledger: dict[str, Any] | None, at: float | None = None) -> None:
        if ledger is None:
            return
        at = time.monotonic() if at is None else at
        samples = self._samples.setdefault(flow, deque())
        if samples and at - samples[-1][0] < MIN_GAP:
            samples.pop()
        samples.append((at, counts_of(ledger)))
        while samples and at - samples[0][0] > WINDOW:
            samples.popleft()

    def rates(self, flow: str) -> dict[str, Any]:
        """{"per_minute": {done, duplicate, retried, dead} | None (one sample yet),
        "over_s", "spark": [done added per sample]}."""
        samples = self._samples.get(flow)
        if not samples or len(samples) < 2:
            return {"per_minute": None, "over_s": None, "spark": []}
        t1, last = samples[-1]
        t0, first = samples[0]
        for t, c in reversed(samples):
            if t1 - t >= 60.0:
                t0, first = t, c
                break
        span = t1 - t0
        per_minute = {
            RATE_NAMES[k]: round(max(0, last[k] - first[k]) * 60.0 / span, 1) for k in COUNTS
        }
        items = list(samples)[-(SPARK + 1) :]
        spark = [max(0, b[1]["processed"] - a[1]["processed"]) for a, b in pairwise(items)]
        return {"per_minute": per_minute, "over_s": round(span, 1), "spark": spark}
