"""A running consumer's published state: one row in the ledger's `consumers` table.

    hb = Heartbeat(ledger_target, flow.name, consumer_state(consumer))
    await hb.start()          # publishes at once, then every `every` s
    hb.poke()                 # publish soon (a state change: the breaker opened)
    await hb.aclose()         # the final row: status "stopped"

`onceq status` reads these rows to show, beside the ledger's counts, what only a
running consumer knows: its breaker, its calls in flight, whether it is connected or
stopping. The ledger is the one place every consumer of a flow already reaches, on
any host, so no new port or service is needed for it.

Why it cannot hurt the consumer it describes:
- its own connection, used only by one worker thread (never the event loop's thread:
  a write waiting for the SQLite write lock or a slow PostgreSQL would stall every
  delivery);
- one tiny upsert every `every` s (5 s), committed without an fsync of its own
  (SQLite synchronous=NORMAL in WAL mode, PostgreSQL synchronous_commit=off on this
  session only): a heartbeat lost to a power cut is rewritten 5 s later, and the
  consumer's group commits keep the disk to themselves;
- a short busy timeout (2 s) on SQLite: when a long group commit holds the write lock
  the heartbeat waits a little and gives up until next time, so the consumer (whose
  own busy timeout is two minutes) never meets "database is locked" because of it;
- it never raises into the loop: a failed write is logged once (WARNING) and retried
  at the next beat; the connection is reopened after an error.

A changed `breaker`, `connected` or `stopping` is noticed within a second (the task
compares the state each second) and published then, so a breaker that opens shows in
`onceq status` in about a second without a hook in the breaker; `poke()` publishes at
once for any other change. A row whose updated_at is older than 3 x every_s, and not
"stopped", is a consumer that died without its final row (`onceq._ops.status`: stale).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import socket
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

from onceq._core.redact import redact_text
from onceq._core.waits import wait
from onceq._ledger.ops import utcnow
from onceq._ledger.target import as_target, is_pg_url

__all__ = ["EVERY", "STALE_AFTER", "Heartbeat", "consumer_id", "consumer_state"]

log = logging.getLogger("onceq.heartbeat")  # the name in every log line: kept across moves

EVERY = 5.0
STALE_AFTER = 3  # x every_s without an update, and not stopped: the consumer died
BUSY_MS = 2000  # SQLite: how long a beat waits for the write lock before skipping
FINAL_WAIT = 5.0  # aclose: how long the final row may take (a dead ledger must not hold a stop)
CHECK = 1.0  # how often the state is compared for a change worth publishing at once
WATCHED = ("breaker", "connected", "stopping")
# Rows of this flow that no one reads any more: a consumer stopped an hour ago, or any
# row a week old (a consumer killed long ago). Pruned when a heartbeat starts.
KEEP_STOPPED_S = 3600.0
KEEP_ANY_S = 7 * 86400.0

_numbers = itertools.count(1)

UPSERT = (
    "INSERT INTO consumers (flow, consumer, host, pid, started_at, updated_at, every_s, state)"
    " VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (flow, consumer) DO UPDATE SET"
    " updated_at = excluded.updated_at, every_s = excluded.every_s, state = excluded.state"
)
PRUNE = (
    "DELETE FROM consumers WHERE flow = ? AND consumer <> ? AND (updated_at < ?"
    ' OR (updated_at < ? AND state LIKE \'%"status": "stopped"%\'))'
)


def consumer_id() -> str:
    """host:pid:n, n counting the heartbeats this process started (`onceq run` runs
    several flows, and a flow may be started twice in one process by a library user)."""
    return f"{socket.gethostname()}:{os.getpid()}:{next(_numbers)}"


def consumer_state(consumer: Any, transport: Any = None) -> Callable[[], dict[str, Any]]:
    """The state callable of an `onceq._core.consumer.Consumer` (read on the loop's thread).

    breaker: closed / open / half-open, None when the flow has none (no call, or off);
    in_flight: handler calls under way; connected: the transport's own answer (a
    broker connection), None where it has none (a directory queue); stopping: a stop
    was asked (a signal, a deadline).
    """
    transport = transport if transport is not None else getattr(consumer, "transport", None)

    def state() -> dict[str, Any]:
        breaker = getattr(consumer, "breaker", None)
        connected = getattr(transport, "connected", None)
        if callable(connected):
            connected = connected()
        return {
            "breaker": None if breaker is None else breaker.state,
            "in_flight": len(getattr(consumer, "_in_flight", {})),
            "connected": None if connected is None else bool(connected),
            "stopping": bool(getattr(consumer, "_stopped", False)),
        }

    return state


class Heartbeat:
    """Publishes `state()` for (flow, a consumer id) into the ledger at `target`."""

    def __init__(
        self,
        target: str | Path,
        flow: str,
        state: Callable[[], dict[str, Any]],
        every: float = EVERY,
    ) -> None:
        target = as_target(target, "ledger")
        # Resolved now: a relative path must mean the folder the consumer was started in.
        self.target = target if is_pg_url(target) else Path(target).resolve()
        self.flow = flow
        self.state = state
        self.every = float(every)
        self.consumer = consumer_id()
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.started_at = utcnow()
        self.writes = 0  # rows written (tests, and a sanity figure)
        self.failures = 0  # writes that failed since the last success
        self._pool: ThreadPoolExecutor | None = None
        self._conn: Any = None  # sqlite3.Connection | HeartbeatSession, the thread's own
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._pruned = False

    # --- the loop's side ---------------------------------------------------------------

    async def start(self) -> None:
        """Publish the first row and keep publishing; idempotent."""
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        # One thread, for ever the same: an SQLite connection belongs to its thread, and
        # one writer means the beats never overtake one another.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onceq-heartbeat")
        self._task = asyncio.create_task(self._run(), name=f"onceq-heartbeat-{self.flow}")

    def poke(self) -> None:
        """Publish soon (from the loop's thread or any other)."""
        loop, wake = self._loop, self._wake
        if loop is None or wake is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            wake.set()
        else:
            loop.call_soon_threadsafe(wake.set)

    async def aclose(self) -> None:
        """Stop beating and publish the final row (status "stopped"), waiting at most
        FINAL_WAIT s for it: a stop is never held by an unreachable ledger."""
        if self._task is None or self._closing:
            return
        self._closing = True
        assert self._wake is not None and self._pool is not None
        self._wake.set()
        # The beat under way is waited for at most FINAL_WAIT as well: on a partitioned
        # PostgreSQL it could hang for a connect timeout and keepalives, holding the stop.
        done, _ = await asyncio.wait([self._task], timeout=FINAL_WAIT)
        if not done:
            self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        written = False
        try:
            await asyncio.wait_for(self._publish(self._snapshot("stopped")), FINAL_WAIT)
            written = True
        except TimeoutError:
            log.warning(
                "the heartbeat's final row for flow %s took over %.0fs",
                self.flow,
                FINAL_WAIT,
                extra={"event": "heartbeat-final-slow"},
            )
        pool = self._pool
        # The close runs after the pending write in the same thread. Waited for when the
        # final row was written (the thread is free, a close takes milliseconds): the
        # ledger's files are as the run left them when the command returns (an SQLite
        # connection still open keeps its -wal and -shm). Not after a write that hung:
        # the close would wait behind it, and a stop is never held by the ledger.
        closed = asyncio.get_running_loop().run_in_executor(pool, self._close_conn)
        pool.shutdown(wait=False)
        if written:
            with contextlib.suppress(TimeoutError, Exception):
                await asyncio.wait_for(closed, FINAL_WAIT)

    async def _run(self) -> None:
        assert self._wake is not None
        last_sent: dict[str, Any] | None = None
        last_at = 0.0
        while not self._closing:
            snap = self._snapshot("running")
            now = time.monotonic()
            changed = last_sent is None or any(snap.get(k) != last_sent.get(k) for k in WATCHED)
            if changed or self._wake.is_set() or now - last_at >= self.every:
                self._wake.clear()
                await self._publish(snap)
                last_sent, last_at = snap, now
            await wait(self._wake, max(0.0, min(CHECK, self.every - (time.monotonic() - last_at))))

    def _snapshot(self, status: str) -> dict[str, Any]:
        try:
            state = dict(self.state())
        except Exception as exc:  # a state callable's bug must not stop the consumer
            state = {"error": redact_text(f"{type(exc).__name__}: {exc}")[:200]}
        state["status"] = status
        return state

    async def _publish(self, state: dict[str, Any]) -> None:
        assert self._loop is not None and self._pool is not None
        # RuntimeError: the pool was shut down (interpreter exit): nothing to publish.
        with contextlib.suppress(RuntimeError):
            await self._loop.run_in_executor(self._pool, self._write, state)

    # --- the worker thread's side ------------------------------------------------------

    def _write(self, state: dict[str, Any]) -> None:
        """One upsert in its own transaction; never raises."""
        row = (
            self.flow,
            self.consumer,
            self.host,
            self.pid,
            self.started_at,
            utcnow(),
            self.every,
            json.dumps(state, sort_keys=True, default=str),
        )
        try:
            if self._conn is None:
                self._conn = self._open()
            if not self._pruned:
                self._prune()
                self._pruned = True
            self._execute(UPSERT, row)
        except Exception as exc:
            self._close_conn()  # reopened at the next beat
            self.failures += 1
            if self.failures == 1:  # once per run of failures, not every 5 s
                log.warning(
                    "cannot publish the consumer state of flow %s: %s (retried every %gs)",
                    self.flow,
                    redact_text(" ".join(str(exc).split())[:300]) or type(exc).__name__,
                    self.every,
                    extra={"event": "heartbeat-failed"},
                )
            return
        self.writes += 1
        if self.failures:
            log.warning(
                "publishing the consumer state of flow %s again",
                self.flow,
                extra={"event": "heartbeat-back"},
            )
        self.failures = 0

    def _open(self) -> Any:
        if is_pg_url(self.target):
            # why: psycopg loads only for a PostgreSQL ledger (start-up of an SQLite run)
            from onceq._ops.pg_sessions import HeartbeatSession

            return HeartbeatSession(str(self.target), FINAL_WAIT)
        # mode=rw: never creates a ledger (the consumer opened, made and migrated it).
        uri = f"file:{quote(str(self.target))}?mode=rw"
        conn = sqlite3.connect(
            uri, uri=True, isolation_level=None, timeout=BUSY_MS / 1000, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout={BUSY_MS}")
        # WAL + NORMAL: this connection's commits are not fsynced (durable at the next
        # checkpoint); the setting is per connection, the consumer's stays FULL.
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def _execute(self, sql: str, args: tuple[Any, ...]) -> None:
        self._conn.execute(sql, args)  # sqlite3's, or HeartbeatSession's ($1 for ?)

    def _prune(self) -> None:
        from datetime import UTC, datetime, timedelta

        now = datetime.now(UTC)

        def ago(s: float) -> str:
            return (now - timedelta(seconds=s)).isoformat(timespec="microseconds")

        self._execute(PRUNE, (self.flow, self.consumer, ago(KEEP_ANY_S), ago(KEEP_STOPPED_S)))

    def _close_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
