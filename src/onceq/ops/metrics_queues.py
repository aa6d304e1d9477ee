"""How deep a flow's queue is, for /metrics: read in the background, served from a cache.

A scrape never touches the queue: each reader refreshes every `EVERY_S` seconds on its
own and a scrape reads the last figures. A directory queue is counted in a process of
its own (`onceq.ops.metrics_scanner`: a scandir of a large inbox/ may take a while and must
neither stall the event loop that runs the consumer nor hold its GIL); a RabbitMQ
queue is read by `onceq.sources.amqp.depths.DepthCache` on its own connection (passive
declares, and the management API for unacked), never one broker request per scrape.

States (the `state` label of onceq_queue_messages):
- directory queue: inbox, processing (every worker's claims), retry, error — the
  counts `onceq dirq lag` prints (`DirQueue.counts`);
- RabbitMQ: ready and unacked of the work queue (unacked only where the management
  API answers), retry (the copies waiting in every retry tier, summed: an operator
  asks "how much is waiting to be retried", and the tier names are the flow's
  configuration, not a dimension of its health), dead (the dead-letter queue).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any

from onceq.errors import OnceqError

log = logging.getLogger("onceq.metrics_queues")  # the name in every log line: kept across moves

EVERY_S = 5.0
DIRQ_STATES = ("inbox", "processing", "retry", "error")


class DirScan:
    """A directory queue's counts and the age of its oldest inbox/ file, every EVERY_S s."""

    def __init__(self, root: str | Path, every: float = EVERY_S) -> None:
        self.root = Path(root)
        self.every = every
        self._counts: dict[str, int] = {}
        self._oldest_mtime: float | None = None
        # inbox/ name -> mtime, kept between scans: a waiting file's mtime does not
        # change, so only names not seen before are stat'ed. A scan of a standing
        # backlog is then one directory listing, not a stat per file (10,000 stats
        # took 43 ms of CPU here, and twice that of the consumer's loop through the
        # GIL: bench/metrics_cost.py measured it as 12 % of a directory queue's rate).
        self._mtimes: dict[str, float] = {}
        self.stats = 0  # stat calls made, all scans together (a test reads it)
        self.error: str | None = None

    def messages(self) -> dict[str, int]:
        return dict(self._counts)

    def oldest_age(self) -> float | None:
        if not self._counts:
            return None  # never read yet: no figure rather than a false 0
        if self._oldest_mtime is None:
            return 0.0
        return max(time.time() - self._oldest_mtime, 0.0)

    def scan(self) -> None:
        """One reading (blocking: run it in a thread)."""
        from onceq.sources.dirq.files import is_message_name
        from onceq.sources.dirq.queue import DirQueue

        try:
            counts = DirQueue(self.root).counts(("processing", "retry", "error"))
            seen, mtimes = self._mtimes, {}
            # inbox/ counted and dated in one pass: a file's mtime is when its producer
            # renamed it in (write_atomic), i.e. when it started waiting.
            with os.scandir(self.root / "inbox") as it:
                for e in it:
                    name = e.name
                    if not is_message_name(name):
                        continue
                    mtime = seen.get(name)
                    if mtime is None:
                        self.stats += 1
                        try:
                            mtime = e.stat(follow_symlinks=False).st_mtime
                        except FileNotFoundError:
                            continue  # claimed while we looked
                    mtimes[name] = mtime
        except (OSError, OnceqError) as exc:
            # The folder vanished or cannot be read: keep the last figures (a scrape
            # shows what was last known); /healthz says the folder is gone.
            self.error = str(exc)
            return
        self.error = None
        # A name claimed and later queued again (a replay, a breaker's release) keeps
        # its old mtime here only if it never left between two scans: it is the same
        # waiting file then.
        self._mtimes = mtimes
        self._counts = {"inbox": len(mtimes), **counts}
        self._oldest_mtime = min(mtimes.values()) if mtimes else None

    @property
    def oldest_mtime(self) -> float | None:
        return self._oldest_mtime

    async def run(self, stop: asyncio.Event) -> None:
        """Scan every `every` s until `stop`: in a child process (onceq.ops.metrics_scanner:
        a scan in a thread holds the consumer's GIL), in a thread if the child fails."""
        from onceq.ops.metrics_scanner import Scanner

        scanner = Scanner(self.root)
        child: Scanner | None = scanner
        try:
            try:
                await scanner.start()
            except OSError:
                child = None
            while not stop.is_set():
                if child is not None:
                    try:
                        counts, oldest, error = await child.scan()
                    except (OSError, ValueError):
                        await child.aclose()
                        child = None  # gone: the thread from now on
                        continue
                    self.error = error
                    if error is None:
                        self._counts, self._oldest_mtime = counts, oldest
                else:
                    await asyncio.to_thread(self.scan)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.every)
        finally:
            if child is not None:
                await child.aclose()


class RabbitDepths:
    """A RabbitMQ flow's queue depths from h1's DepthCache (onceq.sources.amqp.depths)."""

    def __init__(self, amqp_url: str, flow: Any, every: float = EVERY_S) -> None:
        from onceq.sources.amqp.depths import DepthCache, flow_queues, management_api

        self.states = flow_queues(flow)  # [(state, queue name)]
        queues = [q for _, q in self.states]
        self.cache = DepthCache(amqp_url, queues, management_api(amqp_url), every=every)

    def messages(self) -> dict[str, int]:
        snap = self.cache.snapshot()
        out: dict[str, int] = {}
        for state, queue in self.states:
            depth = snap.get(queue)
            if depth is None:
                continue  # not read yet, or the queue does not exist
            out[state] = out.get(state, 0) + depth.ready  # retry: every tier summed
            if state == "ready" and depth.unacked is not None:
                out["unacked"] = depth.unacked
        return out

    def oldest_age(self) -> float | None:
        return None  # AMQP tells no message's age without consuming it

    async def run(self, stop: asyncio.Event) -> None:
        await self.cache.run(stop)


def reader_for(flow: Any, transport: Any) -> DirScan | RabbitDepths | None:
    """The flow's queue reader, or None (a Python transport; a RabbitMQ flow whose
    depth reader is not available)."""
    kind = getattr(flow, "kind", None)
    if kind == "dirq":
        return DirScan(flow.source.path)
    if kind == "rabbitmq":
        try:
            return RabbitDepths(transport.url, flow)
        except OnceqError as exc:  # EAI_RABBITMQ_API mistyped: the figures, not the run
            log.warning(
                "no queue depths for flow %s: %s",
                flow.name,
                exc,
                extra={"event": "depths-unavailable"},
            )
    return None
