"""A consume run's human summary, in the words its JSON uses: what `dirq consume`,
`mq consume`, `onceq run` print and the lab's consume.py prints too (below the cli
layer, so the exercise layer can use it)."""

from __future__ import annotations

from onceq._core.stats import Stats


def _by_reason(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def run_summary(stats: Stats, head: str = "", tail: str = "") -> list[str]:
    """The human summary of a consume run, in the words its JSON uses.

    Every count is `N key` with the very key `Stats.as_dict` gives it ("3 duplicates",
    "2 quarantined" for a directory queue, "2 dead" for a broker), so what a person
    reads and what a script parses say the same thing. A run in which nothing took
    effect gets a first line of its own: a count buried in the middle of a summary is
    how a wholly failed run passes for a finished one.
    """
    word = stats.dead_word
    dead = f"{stats.dead} {word}"
    if stats.reasons:
        dead += f" ({_by_reason(stats.reasons)})"
    parts = [
        f"{stats.received} received",
        f"{stats.processed} processed",
        f"{stats.duplicates} duplicates",
    ]
    if stats.partner_duplicates:  # only an HTTP effect with a duplicate status has them
        parts.append(f"{stats.partner_duplicates} partner_duplicates")
    parts.append(f"{stats.recovered} recovered")
    if stats.requeued:  # only a broker requeues; a directory queue would print "0" forever
        parts.append(f"{stats.requeued} requeued ({_by_reason(stats.requeued_reasons)})")
    parts.append(dead)
    lines = [head + ", ".join(parts) + tail]
    if stats.all_failed:
        lines.insert(0, f"every message failed: {dead}")
    return lines
