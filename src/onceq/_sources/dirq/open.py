"""A directory-queue flow opened for one consumer of a run (`DirFeed`).

The folder is checked before any ledger is opened; the consumer's claim folder
(onceq._sources.dirq.worker) is made only once the ledger is open, so a refused ledger
leaves nothing in processing/. With `until_empty` the run ends when nothing is left
for it: inbox/ empty, nothing of its own unsettled, and nothing waiting in retry/ (it
sleeps until the next retry is due; a stop wakes it); otherwise it keeps looking at
the queue (every POLL_SECONDS when idle) until it is stopped.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from onceq._core.stats import Stats
from onceq._sources.dirq.queue import DirQueue
from onceq._sources.dirq.worker import Worker
from onceq._sources.feed import Feed

__all__ = ["DEAD_WORD", "GROUP", "DirFeed", "in_flight", "stopped_line"]

# One commit holds up to this many outcomes: large enough that the fsync is paid
# rarely, small enough that a crash re-runs little and memory stays flat.
GROUP = 256
# A directory queue's dead letters are files in error/: its summaries (JSON and human)
# call them quarantined, the word its README and error/ folder use.
DEAD_WORD = "quarantined"


def in_flight(effect: Any, calls: bool) -> int:
    """How many files one consumer holds claimed at once.

    The ledger row alone (no call): twice the group, one group being committed while
    the next is claimed. With a call: twice the effect's concurrency. The breaker is
    asked before each call, so every copy already past it when it opens is called
    anyway: with 512 claimed, an outage would try (and move into retry/) the whole
    queue before the breaker could hold anything. And a file claimed ahead of the
    partner's pace only moves the backlog from inbox/ (where `lag` sees it and
    another --workers consumer can take it) into our claim folder.
    """
    if not calls:
        return 2 * GROUP
    return 2 * max(int(getattr(effect, "concurrency", 5) or 1), 1)


def stopped_line(root: Path, signal_name: str | None, stats: Stats) -> str:
    """The one line of a batch a stop signal ended cleanly (`dirq consume`, consume.py)."""
    return (
        f"{root}: stopped by {signal_name} after {stats.received} message(s), each settled;"
        " the rest wait in inbox/"
    )


class DirFeed(Feed):
    """One consumer of the directory queue at `flow.source.path`."""

    tag = "dirq"
    dead_word = DEAD_WORD
    max_group = GROUP

    def __init__(self, flow: Any, until_empty: bool) -> None:
        super().__init__()
        self.flow = flow
        self.follow = not until_empty
        self.queue: DirQueue | None = None

    @property
    def default_ledger(self) -> Path:
        return DirQueue(self.flow.source.path).default_db

    def max_in_flight(self, calls: bool) -> int:
        return in_flight(self.flow.effect, calls)

    async def drive(self, consumer: Any, stop: Any) -> Stats:
        """The consumer's run, then the moves of its last group (`Worker.settle` hands
        them to a thread and returns): the run ends with every settled file moved, and
        a move that failed is its error."""
        stats = await super().drive(consumer, stop)
        assert isinstance(self.transport, Worker)
        await self.transport.moved()
        return stats

    async def check(self) -> None:
        self.queue = DirQueue(self.flow.source.path).check()

    @contextlib.asynccontextmanager
    async def consuming(self) -> AsyncIterator[Any]:
        assert self.queue is not None, "check() first"
        with Worker(self.queue, self.flow.message.max_bytes, follow=self.follow) as worker:
            self.transport = worker
            yield worker
