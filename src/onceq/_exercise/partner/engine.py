"""The stub engine every partner stub runs on: counting, the hold gate, the delay, serving.

A stub is this engine plus a rule set (claims.py, invoices.py) that says which path it
answers, which body field is the message id, and what status a body gets.

    POST <rules.path>  the rule set's answer, after the gate and the delay
    GET  /_stats       {"total": N, <rules.id_stat>: {id: calls}, <tallies>…,
                        "by_status": {...}, "by_key": {Idempotency-Key: calls},
                        "key_missing": N, "key_mismatch": N (calls whose key is missing
                        or is not the body's id), "peak_in_flight": most calls answered
                        at once, "held": calls waiting at the gate,
                        "held_keys": [their keys, oldest first]}
    POST /_reset       clears the stats and the rule set's memory: a fresh stub
    POST /_hold        from now on every call waits (counted, unanswered) until released
    POST /_release     answers every held call and stops holding;
                       ?n=K answers only the K oldest held calls and keeps holding
    POST /_outage      ?mode=refuse|503|hang&seconds=S[&retry_after=N]: down for S
                       seconds, then back by itself (onceq._exercise.partner.outage); /_stats
                       shows "outage": {"mode", "remaining_s"} (null when up) and
                       "calls_during_outage"

Every call is counted before the answer (a 422 or 503 is still a call the partner
saw), so tests can prove "called exactly once" and "called twice, then dead". The
Idempotency-Key header of every call is recorded beside the body's id, so a test
can prove the consumer sends the key the partner deduplicates by.
`delay` is an asyncio.sleep, so concurrent calls overlap, as a slow real system's
would. The hold gate makes a test's timing true by construction instead of by a
race with the clock: "exactly prefetch calls are in flight now", "the connection
drops while these calls wait" hold for as long as the test needs them.
The rule set answers after the gate and the delay, at the moment the answer is sent:
of two calls for one id held together, the one released first is the one a
remembering partner (invoices) accepts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TextIO

from onceq._exercise.partner.outage import Outage, check
from onceq.errors import OnceqError, UsageError


class RuleSet(Protocol):
    """What a partner stub says about a body; one instance per running stub."""

    title: str  # "claim system": the listening line names the stub
    path: str  # the POST route, e.g. "/v1/claims"
    id_field: str  # the body field that is the message id (the Idempotency-Key's value)
    id_stat: str  # its /_stats counter, e.g. "by_guid"
    tallies: ClassVar[Mapping[str, str]]  # further /_stats counters: name → body field
    default_port: int

    def answer(self, doc: Any, ident: str) -> tuple[int, dict[str, Any]]:
        """The status and JSON body for a parsed body (None when it was not JSON)."""
        ...

    def reset(self) -> None:
        """Forget what the partner holds (POST /_reset)."""
        ...


@dataclass
class Stats:
    id_stat: str
    tally_names: tuple[str, ...] = ()
    total: int = 0
    by_id: Counter[str] = field(default_factory=Counter)
    tallies: dict[str, Counter[str]] = field(default_factory=dict)
    by_status: Counter[str] = field(default_factory=Counter)
    by_key: Counter[str] = field(default_factory=Counter)
    key_missing: int = 0
    key_mismatch: int = 0  # key missing, or not the body's id: the dedup would break
    in_flight: int = 0
    peak_in_flight: int = 0  # most calls being answered at once: proves concurrency

    def __post_init__(self) -> None:
        self.tallies = {name: Counter() for name in self.tally_names}

    def as_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            self.id_stat: dict(self.by_id),
            **{name: dict(c) for name, c in self.tallies.items()},
            "by_status": dict(self.by_status),
            "by_key": dict(self.by_key),
            "key_missing": self.key_missing,
            "key_mismatch": self.key_mismatch,
            "peak_in_flight": self.peak_in_flight,
        }

    def reset(self) -> None:
        self.total = self.peak_in_flight = self.key_missing = self.key_mismatch = 0
        for c in (self.by_id, self.by_status, self.by_key, *self.tallies.values()):
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


def make_app(rules: RuleSet, delay: float = 0.0, outage: Outage | None = None) -> Any:
    from aiohttp import web

    stats = Stats(rules.id_stat, tuple(rules.tallies))
    gate = Gate()
    if outage is None:
        outage = Outage(rules.title)

    async def post(request: web.Request) -> web.Response:
        raw = await request.read()
        stats.total += 1
        turned = await outage.turn_away()
        if turned is not None:
            # Down: the front door answers; the rule set and its counters never see
            # the call (onceq._exercise.partner.outage says why).
            status, headers = turned
            stats.by_status[str(status)] += 1
            return web.json_response({"error": "partner down"}, status=status, headers=headers)
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):
            doc = None
        body = doc if isinstance(doc, dict) else {}
        key = request.headers.get("Idempotency-Key")
        body_id = body.get(rules.id_field)
        ident = str(body_id or key or "")
        stats.by_id[ident] += 1
        if key is None:
            stats.key_missing += 1
        else:
            stats.by_key[key] += 1
        if key is None or body_id is None or key != str(body_id):
            stats.key_mismatch += 1
        for name, field_name in rules.tallies.items():
            if body.get(field_name) is not None:
                stats.tallies[name][str(body[field_name])] += 1
        stats.in_flight += 1
        stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
        try:
            await gate.pass_(key if key is not None else ident)
            if delay > 0:
                await asyncio.sleep(delay)
        finally:
            stats.in_flight -= 1
        status, answer = rules.answer(doc, ident)
        stats.by_status[str(status)] += 1
        return web.json_response(answer, status=status)

    async def get_stats(request: web.Request) -> web.Response:
        held = gate.held_keys
        return web.json_response(
            {
                **stats.as_dict(),
                "held": len(held),
                "held_keys": held,
                "outage": outage.as_dict(),
                "calls_during_outage": outage.calls,
            }
        )

    async def reset(request: web.Request) -> web.Response:
        stats.reset()
        rules.reset()
        outage.calls = 0  # the counter only: a reset does not end an outage under way
        return web.json_response({"reset": True})

    async def start_outage(request: web.Request) -> web.Response:
        q = request.query
        try:
            mode = q.get("mode", "")
            seconds = float(q.get("seconds", "nan"))
            retry_after = int(q["retry_after"]) if "retry_after" in q else None
        except ValueError:
            return web.json_response(
                {"error": "seconds or retry_after is not a number"}, status=400
            )
        why = check(mode, seconds, retry_after)
        if why:
            return web.json_response({"error": why}, status=400)
        why = await outage.start(mode, seconds, retry_after)
        if why:
            return web.json_response({"error": why}, status=409)
        return web.json_response({"outage": outage.as_dict()})

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
    app.router.add_post(rules.path, post)
    app.router.add_get("/_stats", get_stats)
    app.router.add_post("/_reset", reset)
    app.router.add_post("/_hold", hold)
    app.router.add_post("/_release", release)
    app.router.add_post("/_outage", start_outage)

    async def answer_the_held(app: web.Application) -> None:
        gate.release()  # a stop must not wait out aiohttp's shutdown timeout on held calls
        await outage.end(quiet=True)  # nor on hung calls

    app.on_shutdown.append(answer_the_held)
    return app


async def serve(
    rules: RuleSet,
    host: str,
    port: int,
    delay: float,
    out: TextIO = sys.stdout,
    down: tuple[str, float, int | None] | None = None,
) -> None:
    """Listen until SIGTERM / SIGINT, then close the listener and open requests cleanly.

    down: (mode, seconds, retry_after) of an outage that starts with the stub.
    """
    from aiohttp import web

    outage = Outage(rules.title, out)
    # access_log=None: one log line per request would make the stub the bottleneck.
    runner = web.AppRunner(make_app(rules, delay, outage), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise UsageError(f"{host}:{port}: cannot listen: {exc.strerror or exc}") from None
    bound = runner.addresses[0][1] if runner.addresses else port
    stop = asyncio.Event()
    lost: list[str] = []  # why it could not listen again after a refuse outage

    async def close_listener() -> None:
        nonlocal site
        await site.stop()
        # Kept-alive connections too: a client's pooled connection would otherwise
        # still reach a stub that "refuses connections". A busy one closes after its
        # answer.
        for handler in runner.server.connections if runner.server is not None else ():
            handler.close()

    async def open_listener() -> None:
        nonlocal site
        # The same port: the client's URL must work again. A new site, as a stopped
        # one is unregistered from the runner.
        why = ""
        for _ in range(50):  # the port was ours a moment ago: a short wait, not a failure
            site = web.TCPSite(runner, host, bound)
            try:
                await site.start()
                return
            except OSError as exc:
                why = exc.strerror or str(exc)
                await site.stop()  # registered with the runner though not listening
                await asyncio.sleep(0.1)
        lost.append(why)
        stop.set()  # a stub that cannot come back ends (exit 1), rather than stay down unseen

    outage.close_listener, outage.open_listener = close_listener, open_listener
    if down is not None:
        # Down before the listening line is printed: whoever waits for that line to
        # connect meets the outage, never a moment of a stub that is up.
        why = await outage.start(*down, announce=False)
        if why:
            await runner.cleanup()
            raise UsageError(f"--down-for/--down-as: {why}")
    out.write(f"{rules.title} stub listening on http://{host}:{bound}\n")
    if down is not None:
        out.write(outage.down_line(down[0], down[1]) + "\n")
    out.flush()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await outage.end(quiet=True)
        await runner.cleanup()
    if lost:
        raise OnceqError(f"{host}:{bound}: cannot listen again after the outage: {lost[0]}")


def run_stub(
    new_rules: Callable[[], RuleSet],
    host: str,
    port: int | None,
    delay: float,
    down: tuple[str, float, int | None] | None = None,
) -> None:
    """Run a stub of `new_rules()` (on its default port when port is None) until a signal.

    down: (mode, seconds, retry_after): an outage from the start (onceq._exercise.partner.outage).
    """
    rules = new_rules()
    asyncio.run(serve(rules, host, rules.default_port if port is None else port, delay, down=down))
