"""The claim-system stub: what the consumer calls in demos, tests and benchmarks.

    POST /v1/claims   400 body not a JSON object
                      422 docs missing or empty          (business rejection)
                      503 claimId starts with BUSY        (transient)
                      201 otherwise
    GET  /_stats      {"total": N, "by_guid": {...}, "by_claim": {...}, "by_status": {...},
                       "peak_in_flight": most calls answered at once}
    POST /_reset      clears the stats

Every call is counted before the answer (a 422 or 503 is still a call the partner
saw), so tests can prove "called exactly once" and "called twice, then dead".
`delay` is an asyncio.sleep, so concurrent calls overlap, as a slow real system's
would: that is what makes prefetch observable.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TextIO

from onceq.errors import UsageError


@dataclass
class ClaimStats:
    total: int = 0
    by_guid: Counter[str] = field(default_factory=Counter)
    by_claim: Counter[str] = field(default_factory=Counter)
    by_status: Counter[str] = field(default_factory=Counter)
    in_flight: int = 0
    peak_in_flight: int = 0  # most calls being answered at once: proves concurrency

    def as_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "by_guid": dict(self.by_guid),
            "by_claim": dict(self.by_claim),
            "by_status": dict(self.by_status),
            "peak_in_flight": self.peak_in_flight,
        }


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

    async def post_claim(request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):
            doc = None
        guid = (doc.get("guid") if isinstance(doc, dict) else None) or request.headers.get(
            "Idempotency-Key", ""
        )
        claim_id = doc.get("claimId") if isinstance(doc, dict) else None
        stats.total += 1
        stats.by_guid[str(guid)] += 1
        if claim_id is not None:
            stats.by_claim[str(claim_id)] += 1
        stats.in_flight += 1
        stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
        try:
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
        return web.json_response(stats.as_dict())

    async def reset(request: web.Request) -> web.Response:
        stats.total = stats.peak_in_flight = 0
        for c in (stats.by_guid, stats.by_claim, stats.by_status):
            c.clear()
        return web.json_response({"reset": True})

    app = web.Application(client_max_size=4 * 1024 * 1024)
    app.router.add_post("/v1/claims", post_claim)
    app.router.add_get("/_stats", get_stats)
    app.router.add_post("/_reset", reset)
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
