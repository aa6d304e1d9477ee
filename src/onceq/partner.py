"""The claim-system stub: what the consumer calls in demos, tests and benchmarks.

    POST /v1/claims   400 body not a JSON object
                      422 docs missing or empty          (business rejection)
                      503 claimId starts with BUSY        (transient)
                      201 otherwise
    GET  /_stats      {"total": N, "by_guid": {...}, "by_claim": {...}, "by_status": {...},
                       "by_key": {Idempotency-Key: calls}, "key_missing": N,
                       "key_mismatch": N (calls whose key is missing or is not the body's guid),
                       "peak_in_flight": most calls answered at once,
                       "held": calls waiting at the gate, "held_keys": [their keys, oldest first]}
    POST /_reset      clears the stats
    POST /_hold       from now on every call waits (counted, unanswered) until released
    POST /_release    answers every held call and stops holding;
                      ?n=K answers only the K oldest held calls and keeps holding

Every call is counted before the answer (a 422 or 503 is still a call the partner
saw), so tests can prove "called exactly once" and "called twice, then dead". The
Idempotency-Key header of every call is recorded beside the body's guid, so a test
can prove the consumer sends the key the partner deduplicates by.
`delay` is an asyncio.sleep, so concurrent calls overlap, as a slow real system's
would. The hold gate makes a test's timing true by construction instead of by a
race with the clock: "exactly prefetch calls are in flight now", "the connection
drops while these calls wait" hold for as long as the test needs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, TextIO

from onceq.errors import UsageError


@dataclass
class ClaimStats:
    total: int = 0
    by_guid: Counter[str] = field(default_factory=Counter)
    by_claim: Counter[str] = field(default_factory=Counter)
    by_status: Counter[str] = field(default_factory=Counter)
    by_key: Counter[str] = field(default_factory=Counter)
    key_missing: int = 0
    key_mismatch: int = 0  # key missing, or not the body's guid: the dedup would break
    in_flight: int = 0
    peak_in_flight: int = 0  # most calls being answered at once: proves concurrency

    def as_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "by_guid": dict(self.by_guid),
            "by_claim": dict(self.by_claim),
            "by_status": dict(self.by_status),
            "by_key": dict(self.by_key),
            "key_missing": self.key_missing,
            "key_mismatch": self.key_mismatch,
            "peak_in_flight": self.peak_in_flight,
        }

    def reset(self) -> None:
        self.total = self.peak_in_flight = self.key_missing = self.key_mismatch = 0
        for c in (self.by_guid, self.by_claim, self.by_status, self.by_key):
            c.clear()


class Gate:
    """Holds calls until a test releases them (oldest first), while holding is on."""

    def __init__(self) -> None:
        self.holding = False
        self._waiting: deque[tuple[str, asyncio.Future[None]]] = deque()

    @property
    def held_keys(self) -> list[str]:
        return [key for key, _ in self._waiting]

    async def pass_(self, key: str) -> None:
        if not self.holding:
            return
        entry = (key, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        try:
            await entry[1]
        finally:
            # Cancelled while held (the server shutting down): no longer held.
            with contextlib.suppress(ValueError):
                self._waiting.remove(entry)

    def release(self, n: int | None = None) -> int:
        """Answer the n oldest held calls (all, and stop holding, when n is None)."""
        if n is None:
            self.holding = False
            n = len(self._waiting)
        released = 0
        # Popped now, not when each call resumes: /_stats never counts a released call
        # as held.
        while self._waiting and released < n:
            _, waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
            released += 1
        return released


def classify(doc: Any) -> int:
    """The status the claim system gives a parsed body."""
    if not isinstance(doc, dict):
        return 400
    docs = doc.get("docs")
    if not docs:  # missing, null, empty list / string / object
        return 422
    if str(doc.get("claimId", "")).startswith("BUSY"):
        return 503
    return 201


def make_app(delay: float = 0.0) -> Any:
    from aiohttp import web

    stats = ClaimStats()
    gate = Gate()

    async def post_claim(request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):
            doc = None
        key = request.headers.get("Idempotency-Key")
        body_guid = doc.get("guid") if isinstance(doc, dict) else None
        guid = body_guid or key or ""
        claim_id = doc.get("claimId") if isinstance(doc, dict) else None
        stats.total += 1
        stats.by_guid[str(guid)] += 1
        if key is None:
            stats.key_missing += 1
        else:
            stats.by_key[key] += 1
        if key is None or key != str(body_guid):
            stats.key_mismatch += 1
        if claim_id is not None:
            stats.by_claim[str(claim_id)] += 1
        stats.in_flight += 1
        stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
        try:
            await gate.pass_(str(key if key is not None else guid))
            if delay > 0:
                await asyncio.sleep(delay)
        finally:
            stats.in_flight -= 1
        status = classify(doc)
        stats.by_status[str(status)] += 1
        body = {
            201: {"status": "accepted", "guid": guid},
            400: {"error": "body is not a JSON object"},
            422: {"error": "docs missing or empty"},
            503: {"error": "claim system busy"},
        }[status]
        return web.json_response(body, status=status)

    async def get_stats(request: web.Request) -> web.Response:
        held = gate.held_keys
        return web.json_response({**stats.as_dict(), "held": len(held), "held_keys": held})

    async def reset(request: web.Request) -> web.Response:
        stats.reset()
        return web.json_response({"reset": True})

    async def hold(request: web.Request) -> web.Response:
        gate.holding = True
        return web.json_response({"holding": True})

    async def release(request: web.Request) -> web.Response:
        raw = request.query.get("n")
        if raw is not None and not (raw.isascii() and raw.isdigit()):
            return web.json_response({"error": "n is not a count"}, status=400)
        released = gate.release(None if raw is None else int(raw))
        return web.json_response({"released": released, "holding": gate.holding})

    app = web.Application(client_max_size=4 * 1024 * 1024)
    app.router.add_post("/v1/claims", post_claim)
    app.router.add_get("/_stats", get_stats)
    app.router.add_post("/_reset", reset)
    app.router.add_post("/_hold", hold)
    app.router.add_post("/_release", release)

    async def answer_the_held(app: web.Application) -> None:
        gate.release()  # a stop must not wait out aiohttp's shutdown timeout on held calls

    app.on_shutdown.append(answer_the_held)
    app["stats"] = stats
    return app


async def serve(host: str, port: int, delay: float, out: TextIO = sys.stdout) -> None:
    """Listen until SIGTERM / SIGINT, then close the listener and open requests cleanly."""
    from aiohttp import web

    # access_log=None: one log line per request would make the stub the bottleneck.
    runner = web.AppRunner(make_app(delay), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise UsageError(f"{host}:{port}: cannot listen: {exc.strerror or exc}") from None
    bound = runner.addresses[0][1] if runner.addresses else port
    out.write(f"claim system stub listening on http://{host}:{bound}\n")
    out.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def run(host: str = "127.0.0.1", port: int = 9202, delay: float = 0.0) -> None:
    asyncio.run(serve(host, port, delay))
