"""`onceq status --watch`'s rates: processed/s and dead/s over the last minute.

The ledger counts are totals; a rate is the difference between two of them over the
time between them. `Rates` keeps the snapshots of the last `window` seconds (one per
refresh: 30 at the default 2 s) and divides the newest minus the oldest by their
distance, so one slow refresh does not make the rate jump. A count that went down (a
dead letter replayed, a ledger pruned) gives a rate of 0, not a negative one: the
rate says how fast things happen, not what an operator undid.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

WINDOW = 60.0
FIELDS = (("processed", "processed_per_s"), ("dead", "dead_per_s"))


class Rates:
    """Snapshots of the ledger counts per flow, `window` seconds of them."""

    def __init__(self, window: float = WINDOW) -> None:
        self.window = window
        self._snaps: deque[tuple[float, dict[str, dict[str, int]]]] = deque()

    def add(self, doc: dict[str, Any], at: float | None = None) -> dict[str, dict[str, Any]]:
        """Record `doc` (a `onceq._ops.status.gather` result) and return each flow's rates:
        {flow: {"processed_per_s", "dead_per_s", "over_s"}}, None before two snapshots."""
        at = time.monotonic() if at is None else at
        counts = {
            name: {f: int(e["ledger"][f]) for f, _ in FIELDS}
            for name, e in doc["flows"].items()
            if e.get("ledger") is not None
        }
        self._snaps.append((at, counts))
        while len(self._snaps) > 2 and at - self._snaps[1][0] >= self.window:
            self._snaps.popleft()
        t0, first = self._snaps[0]
        out: dict[str, dict[str, Any]] = {}
        for name in doc["flows"]:
            rates: dict[str, Any] = {k: None for _, k in FIELDS}
            rates["over_s"] = None
            if name in counts and name in first and at > t0:
                for f, key in FIELDS:
                    rates[key] = round(max(0, counts[name][f] - first[name][f]) / (at - t0), 3)
                rates["over_s"] = round(at - t0, 1)
            out[name] = rates
        return out
