"""The in-flight guard on PostgreSQL: a session-level advisory lock per (flow, msg_id).

Twins of one message in two consumer processes (two hosts) must not both call the
partner. Each process holds, on a connection of its own, an advisory lock keyed by
`hashtextextended(flow || '/' || msg_id, 0)` while that message is in flight (claimed
before the duplicate check, released after its outcome is committed and settled).

Why advisory locks and not a lease row:
- a session-level lock belongs to the connection: when the holder dies (kill -9, a
  host gone and its TCP keepalives expired) the server ends the session and drops its
  locks, so no lease ever blocks a message for ever and there is no expiry to tune;
- it writes nothing: no WAL, no bloat, no vacuum, no row to clean up after a crash.

Round trips are the cost, so claims made in one event-loop tick go out as ONE query
(the ids as one JSON text, `sql.batch`), and so do releases; a release waits for the next claim
batch to ride with (RELEASE_WAIT_S at most) instead of costing a round trip of its
own. With `lookup` (what `PgLedger.inflight_guard` builds) the same round trip also
does the loop's duplicate check: after the claim, a second statement reads the
ledger's refs of the batch's ids, and a claim answers `Checked(ref)` (see
`guard_session.LOOKUP_SQL` for why that read cannot miss a twin's commit). The three statements
are one call of a function the session makes for itself (`guard_session.CLAIM_FN`),
or one pipeline where it cannot make one. A claim that finds the lock held
(`pg_try_advisory_lock` is false: never a blocking `pg_advisory_lock`, which would
hold the shared connection) asks again after 5 ms, doubling to 200 ms.

A lost guard connection (a restart, a terminated session, a failover): claims are
granted WITHOUT a lock until it reconnects (backoff 0.2 s doubling to 5 s), with one
WARNING line when lost and one when back. Deliberately: the guard saves partner calls,
it is not what makes consumption effectively once (the ledger's primary key is), so
waiting on it would stop the run for what is at worst a twin's second call. When the
database itself is away the ledger's reads fail too and the loop holds its copies
(`onceq._core.consumer`), so in practice nothing is called unguarded for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import psycopg

from onceq._core.inflight import POLL_FIRST_S, POLL_MAX_S, Checked
from onceq._core.redact import redact_url
from onceq._ledger.pg.guard_session import (
    CLAIM_FN_CALL,
    CLAIM_SQL,
    LOOKUP_SQL,
    UNLOCK_SQL,
    guard_conninfo,
    make_claim_fn,
    sendable,
)
from onceq._ledger.pg.pipeline import forget_prepared
from onceq._ledger.pg.sql import batch
from onceq.errors import LedgerError, redact_text

log = logging.getLogger("onceq.pg.guard")  # the name in every log line: kept across moves

# The longest an unlock waits for a claim batch to go out with (`release`).
RELEASE_WAIT_S = 0.005
# A guard query is a lock-table lookup: one that takes longer than this means the
# connection is gone without saying so (a partition), and the claims waiting on it
# would otherwise wait for the TCP keepalives.
QUERY_TIMEOUT_S = 5.0
RECONNECT_FIRST_S = 0.2
RECONNECT_MAX_S = 5.0


# What a batch answers each claim: REFUSED (another session holds the lock: ask again),
# else what `claim` returns.
REFUSED = object()
Answer = Checked | None | object

_LOST = (psycopg.OperationalError, psycopg.InterfaceError, TimeoutError)
# "out of shared memory": every advisory lock takes a slot of the server's lock table
# (max_locks_per_transaction × (max_connections + max_prepared_transactions) slots in
# all), and N consumers × prefetch leases can fill it. The session is fine, so it is
# kept (closing it would drop every lease this process holds); the batch goes
# unguarded, with a WARNING at most once a minute.
SHORT_OF_LOCKS = ("53200",)
SHORT_WARN_EVERY_S = 60.0


class PgGuard:
    """Advisory locks on one AsyncConnection (autocommit) for the flow `flow`."""

    def __init__(self, url: str, flow: str, *, lookup: bool = False) -> None:
        self.flow = flow
        self.lookup = lookup  # also do the duplicate check (the ledger's schema exists)
        self.path = redact_url(url)  # what messages name: the password masked
        self._conninfo = guard_conninfo(url)
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._claims: list[tuple[str, asyncio.Future[Answer]]] = []  # for the next batch
        self._releases: list[str] = []  # for the next batch (release)
        self._release_timer: asyncio.TimerHandle | None = None
        self._held: set[str] = set()  # locked on the CURRENT session
        self._work = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._down_since: float | None = None
        self._next_connect = 0.0
        self._backoff = RECONNECT_FIRST_S
        # Figures for tests and summaries.
        self.waits = 0  # claims that found their id held at least once
        self.unguarded = 0  # claims granted without a lock (the connection was away)
        self.batches = 0  # claim queries sent
        self._fn = False  # CLAIM_FN exists on the current session
        self._short_warned = -SHORT_WARN_EVERY_S

    # --- InflightGuard ----------------------------------------------------------------

    async def claim(self, msg_id: str) -> Checked | None:
        msg_id = sendable(msg_id)
        delay = POLL_FIRST_S
        waited = False
        while (answer := await self._ask(msg_id)) is REFUSED:
            if not waited:
                waited = True
                self.waits += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, POLL_MAX_S)
        return answer if isinstance(answer, Checked) else None

    async def release(self, msg_id: str) -> None:
        # Not awaited: the unlock goes out with the next claim batch, or RELEASE_WAIT_S
        # later when none comes. A twin elsewhere polls anyway (5 ms doubling), and the
        # copy's slot should not wait for a round trip. Sent at once, each release was
        # a round trip of its own: the next delivery's claim comes a broker round trip
        # after the ack, never in the same tick. Held a little longer, a lock can only
        # make a twin wait, never let two calls through.
        msg_id = sendable(msg_id)
        if msg_id in self._held:
            self._held.discard(msg_id)
            self._releases.append(msg_id)
            if self._release_timer is None and not self._closed:
                loop = asyncio.get_running_loop()
                self._release_timer = loop.call_later(RELEASE_WAIT_S, self._releases_due)

    def _releases_due(self) -> None:
        self._release_timer = None
        if self._releases and not self._closed:
            self._kick()

    async def aclose(self) -> None:
        """Close the connection: the server drops every lock it held."""
        self._closed = True
        if self._release_timer is not None:
            self._release_timer.cancel()  # the locks go with the session, below
            self._release_timer = None
        task = self._task
        if task is not None:
            # Python 3.11's asyncio.wait_for (which bounded the flusher's queries until
            # they moved to asyncio.timeout) swallows a cancel that lands as its inner
            # await finishes: the flusher then went back to waiting for work, for
            # ever, and this close with it (a run that never ended, idle;
            # tests/unit/test_pg_guard_lost_cancel.py). So the flag ends its loop
            # too, and the cancel is repeated until the task is done: whatever the
            # flusher awaits, a close never depends on one cancel arriving.
            while not task.done():
                task.cancel()
                self._work.set()
                await asyncio.wait({task}, timeout=0.1)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                task.result()
        for _, fut in self._claims:
            fut.cancel()
        self._claims.clear()
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None

    # --- batching ---------------------------------------------------------------------

    def _ask(self, msg_id: str) -> asyncio.Future[Answer]:
        """A future answered by the next batch: REFUSED while another session holds the
        lock, else the claim's answer (`Checked` when looked up)."""
        fut: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        if self._closed:
            fut.set_result(None)  # closing: nothing left to guard against
            return fut
        self._claims.append((msg_id, fut))
        self._kick()
        return fut

    def _kick(self) -> None:
        self._work.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._flusher(), name="onceq-guard")

    async def _flusher(self) -> None:
        while not self._closed:
            await self._work.wait()
            self._work.clear()
            if self._closed:
                return
            # One more turn of the loop: the other copies of this tick ask too, and
            # their claims join this batch (claims that come while a batch is out
            # join the next one).
            await asyncio.sleep(0)
            releases, self._releases = self._releases, []
            claims, self._claims = self._claims, []
            if releases and self._release_timer is not None:
                self._release_timer.cancel()  # they go out now, with these claims
                self._release_timer = None
            try:
                await self._flush(releases, claims)
            except Exception as exc:  # a bug here must not leave claims waiting for ever
                log.exception(
                    "in-flight guard on %s: batch failed",
                    self.path,
                    extra={"event": "guard-failed"},
                )
                for _, fut in claims:
                    if not fut.done():
                        fut.set_exception(exc)

    async def _flush(
        self, releases: list[str], claims: list[tuple[str, asyncio.Future[Answer]]]
    ) -> None:
        if not releases and not claims:
            return
        conn = await self._connection()
        refused: set[str] | None = None
        found: dict[str, str] | None = None
        if conn is not None:
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for ran the query in a
                # task of its own (one more task per batch) and dropped a cancel that
                # landed as the answer came in (see `aclose`); here the query runs in
                # the flusher's task and a cancel reaches it whatever else is due.
                async with asyncio.timeout(QUERY_TIMEOUT_S):
                    refused, found = await self._send(conn, releases, claims)
            except _LOST as exc:
                if getattr(exc, "sqlstate", None) in SHORT_OF_LOCKS:
                    self._warn_short(exc)  # the session (and its locks) is fine
                else:
                    await self._lost(exc)
            except psycopg.Error as exc:
                # Not a lost connection: the server refuses the query itself (no
                # hashtextextended before PostgreSQL 11, a permission): a setup the
                # guard cannot work with, reported instead of retried for ever.
                err = LedgerError(
                    f"{self.path}: the in-flight guard's query failed:"
                    f" {redact_text(str(exc).strip())}"
                )
                for _, fut in claims:
                    if not fut.done():
                        fut.set_exception(err)
                return
        for msg_id, fut in claims:
            answer: Answer = None
            if refused is None:  # no connection: granted unguarded (module docstring)
                self.unguarded += 1
                locked = False  # and not looked up: the loop's own read says the ledger is away
            elif locked := msg_id not in refused:
                answer = None if found is None else Checked(found.get(msg_id))
            else:
                answer = REFUSED
            if fut.cancelled():  # the copy gave up (a stop) while its claim was out
                if locked:
                    self._releases.append(msg_id)
                    self._work.set()
                continue
            if locked:
                self._held.add(msg_id)
            fut.set_result(answer)

    async def _send(
        self,
        conn: psycopg.AsyncConnection[Any],
        releases: list[str],
        claims: list[tuple[str, asyncio.Future[Answer]]],
    ) -> tuple[set[str] | None, dict[str, str] | None]:
        """Releases, then claims, then (with `lookup`) the claimed ids' refs, in one round
        trip (pipeline mode): the claimed ids that another session holds, and the refs
        found (None: not looked up).

        A pipeline of prepared statements, not one simple query with the arguments
        bound client-side: that cost the loop ~25 µs less CPU a batch but the server
        ~70 µs more (it parsed and planned the statements every time; claims of 2 and
        their releases, measured: client 178-200 against 204-223 µs, server 125-155
        against 60-75 µs)."""
        if not claims:
            await conn.execute(UNLOCK_SQL, (self.flow, batch(releases)), binary=True)
            return None, None
        self.batches += 1
        ids = [m for m, _ in claims]
        if self._fn:
            cur = await conn.execute(CLAIM_FN_CALL, (self.flow, batch(releases), batch(ids)))
            refused: set[str] = set()
            found: dict[str, str] = {}
            for id_, ref in await cur.fetchall():
                if ref is None:
                    refused.add(id_)
                else:
                    found[id_] = ref
            return refused, found
        look = None
        try:
            async with conn.pipeline():
                if releases:
                    # First: a lock freed here may be what a claim below wants.
                    await conn.execute(UNLOCK_SQL, (self.flow, batch(releases)), binary=True)
                cur = await conn.execute(CLAIM_SQL, (batch(ids), self.flow), binary=True)
                if self.lookup:  # after the claim, never inside it: see LOOKUP_SQL
                    look = conn.cursor()
                    await look.execute(LOOKUP_SQL, (self.flow, batch(ids)), binary=True)
        except BaseException:
            # A statement skipped after a failed one (short of locks: the session is
            # kept) may have been a preparation psycopg counts as done.
            if not conn.closed and not forget_prepared(conn):
                await conn.close()
            raise
        refused = {r[0] for r in await cur.fetchall()}
        return refused, None if look is None else dict(await look.fetchall())

    # --- the connection ---------------------------------------------------------------

    async def _connection(self) -> psycopg.AsyncConnection[Any] | None:
        """The live connection, or None while it is away (one attempt per backoff step,
        so claims are not held up by a connect timeout on every batch)."""
        if self._conn is not None and not self._conn.closed:
            return self._conn
        if time.monotonic() < self._next_connect:
            return None
        try:
            conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
            try:
                # Bounded as every query of the guard: a session that cannot set itself
                # up (CREATE FUNCTION waiting on a catalog lock, a server that stopped
                # answering) is a connection away, never a batch whose claims wait for
                # ever. connect_timeout bounds only the connect.
                async with asyncio.timeout(QUERY_TIMEOUT_S):  # not wait_for: see _flush
                    self._fn = await self._set_up(conn)
            except BaseException:
                await conn.close()
                raise
            self._conn = conn
        except (psycopg.Error, TimeoutError) as exc:
            self._next_connect = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, RECONNECT_MAX_S)
            if self._down_since is None:
                self._warn_lost(exc)
            return None
        self._backoff = RECONNECT_FIRST_S
        if self._down_since is not None:
            log.warning(
                "in-flight guard on %s: reconnected after %.1f s",
                self.path,
                time.monotonic() - self._down_since,
                extra={"event": "guard-back"},
            )
            self._down_since = None
        return self._conn

    async def _set_up(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        # LOOKUP_SQL's correctness needs a snapshot per statement: whatever the
        # server's default_transaction_isolation, this session reads committed.
        await conn.execute("SET default_transaction_isolation = 'read committed'")
        return self.lookup and await make_claim_fn(conn)

    async def _lost(self, exc: BaseException) -> None:
        # The session is gone, and its locks with it: nothing of ours is held now.
        self._held.clear()
        self._releases.clear()
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
        self._warn_lost(exc)

    def _warn_short(self, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._short_warned >= SHORT_WARN_EVERY_S:
            self._short_warned = now
            log.warning(
                "in-flight guard on %s: the server is out of lock space (%s); claims go"
                " unguarded meanwhile (raise max_locks_per_transaction: each consumer"
                " holds up to its prefetch in advisory locks)",
                self.path,
                type(exc).__name__,
                extra={"event": "guard-short"},
            )

    def _warn_lost(self, exc: BaseException) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
            # The exception's type only: a driver's text may quote the connection string.
            log.warning(
                "in-flight guard on %s: connection lost (%s); claims go unguarded until"
                " it is back (the ledger still records each message once)",
                self.path,
                type(exc).__name__,
                extra={"event": "guard-lost"},
            )
