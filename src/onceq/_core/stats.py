"""What one run did, by final outcome: the counters every summary reports.

Kept apart from the consume loop (onceq._core.consumer), which fills them in as it settles;
`from onceq._core.consumer import Stats` keeps working.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from onceq._core.entry import Entry
from onceq._core.transport import DELAY, DUPLICATE, RELEASE, REQUEUE, SUCCESS

# The counters a summary reports, in the order it reports them.
COUNTS = (
    "received",
    "processed",
    "duplicates",
    "partner_duplicates",
    "recovered",
    "requeued",
    "held",
    "dead",
)


# Each settled entry's counter (a field of Stats) and the word /metrics gives it
# (onceq_messages_total{outcome=...}): one table, so a summary and a scrape of the same
# run can never disagree about what an entry was.
OUTCOMES: dict[str, str] = {
    "processed": "processed",
    "duplicates": "duplicate",
    "partner_duplicates": "partner_duplicate",
    "recovered": "recovered",
    "requeued": "retried",
    "held": "held",
    "dead": "dead",
}


def outcome_of(e: Entry) -> str:
    """The Stats counter a settled entry adds to (a key of OUTCOMES)."""
    if e.recovered:
        return "recovered"
    if e.kind is SUCCESS:
        return "partner_duplicates" if e.fields.get("partner_duplicate") else "processed"
    if e.kind is DUPLICATE:
        return "duplicates"
    if e.settle is RELEASE:
        return "held"
    if e.settle in (REQUEUE, DELAY):
        return "requeued"
    return "dead"


@dataclass
class Stats:
    """What one run did, by final outcome.

    `reasons` counts the dead letters by reason, and only them: a summary that mixed
    in the retries would report more failures than messages were lost. A requeue is
    not a verdict (the copy comes back), so its reasons are kept apart.
    `dead_word` is the transport's name for a dead letter ("quarantined" for a
    directory queue, whose error/ folder holds them); JSON and human summaries both
    use it, so a user meets one word for one outcome.
    """

    received: int = 0
    processed: int = 0
    duplicates: int = 0
    # Done, but the partner said it already had it (an HTTP 409 by default): the
    # message is recorded like any success and counted apart, so a run that only
    # re-sent what a partner held does not read as one that created everything.
    partner_duplicates: int = 0
    recovered: int = 0  # committed by a crashed run; only the settle was redone
    requeued: int = 0  # retried: at once (requeue) or after a delay (a retry tier)
    # Given back untried (no attempt spent): the breaker was open, or the ledger away.
    held: int = 0
    dead: int = 0
    reasons: Counter[str] = field(default_factory=Counter)  # dead letters by reason
    requeued_reasons: Counter[str] = field(default_factory=Counter)
    dead_word: str = field(default="dead", compare=False)
    # Set when the misconfiguration guard stopped the run: its one-line hint
    # (onceq._core.misconfig). The first `misconfigured` failures are counted in `dead`.
    misconfigured: str = field(default="", compare=False)

    def add(self, e: Entry) -> None:
        if e.kind is SUCCESS and not e.recovered and not e.fields.get("partner_duplicate"):
            self.processed += 1  # the common case, without outcome_of's call and setattr
            return
        word = outcome_of(e)
        setattr(self, word, getattr(self, word) + 1)
        if word == "requeued":
            self.requeued_reasons[e.reason] += 1
        elif word == "dead":
            self.reasons[e.reason] += 1

    @property
    def all_failed(self) -> bool:
        """Every message that reached a verdict was a dead letter: nothing took effect.

        A run that only failed deserves more than a count buried in a summary line
        (a wrong --required, a claim system that refuses everything).
        """
        done = self.processed + self.duplicates + self.partner_duplicates + self.recovered
        return self.dead > 0 and done == 0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in COUNTS if k != "dead"}
        out[self.dead_word] = self.dead
        out["reasons"] = dict(sorted(self.reasons.items()))
        out["requeued_reasons"] = dict(sorted(self.requeued_reasons.items()))
        out["all_failed"] = self.all_failed
        if self.misconfigured:  # only then: a normal run's JSON keeps its keys
            out["misconfigured"] = self.misconfigured
        return out

    def merge(self, d: dict[str, Any]) -> None:
        """Add another run's `as_dict()` (a --workers child's report) to these counts."""
        for k in COUNTS:
            key = self.dead_word if k == "dead" else k
            # .get: a report of an older onceq (no partner_duplicates) still merges.
            setattr(self, k, getattr(self, k) + d.get(key, 0))
        self.reasons.update(d["reasons"])
        self.requeued_reasons.update(d["requeued_reasons"])
        self.misconfigured = self.misconfigured or d.get("misconfigured", "")
