"""The console's HTTP server: the page, its assets and the API, on one aiohttp app.

`serve` runs it until a stop signal (`onceq console`); `ConsoleThread` runs it beside a
run in a thread of its own, with an event loop of its own (`onceq run --console-port`),
so a slow page never holds up the consume loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from importlib import resources
from typing import Any

from aiohttp import web

from onceq._console.api import CSRF, STATE, add_routes, errors
from onceq._console.guard import Guard, check_bind, read_token
from onceq._console.state import ConsoleState
from onceq.errors import Conflict

MAX_LINE = 32 * 1024
ASSETS = {
    "/": ("index.html", "text/html"),
    "/console.js": ("console.js", "text/javascript"),
    "/console.css": ("console.css", "text/css"),
}


def make_app(state: ConsoleState, token: str | None) -> web.Application:
    guard = Guard(token)
    app = web.Application(middlewares=[guard.middleware, errors], client_max_size=256 * 1024)
    app[STATE] = state
    app[CSRF] = guard.csrf
    add_routes(app, state.read_only)
    for path, (name, kind) in ASSETS.items():
        app.router.add_get(path, _asset(name, kind))
    app.router.add_get("/favicon.ico", _no_icon)
    return app


async def _no_icon(request: web.Request) -> web.Response:
    return web.Response(status=204)  # no icon: a browser asks, and should not see a 404


def _asset(name: str, kind: str) -> Any:
    data = resources.files("onceq._console").joinpath("static", name).read_bytes()

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=data, content_type=kind, charset="utf-8")

    return handler


async def start(app: web.Application, host: str, port: int) -> web.AppRunner:
    # A request line as long as the document allows (1,024 characters of a query value,
    # percent-encoded up to 12 bytes each) is parsed, not refused as text by the parser.
    runner = web.AppRunner(app, access_log=None, max_line_size=MAX_LINE)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise Conflict(f"--port {port}: cannot listen on {host}:{port} ({exc.strerror})") from None
    return runner


def serve(state: ConsoleState, host: str, port: int, token: str | None, ready: Any = None) -> None:
    """Serve until SIGINT/SIGTERM; `ready(url)` once it listens."""
    check_bind(host, token)

    async def main() -> None:
        runner = await start(make_app(state, token), host, port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if ready is not None:
            ready(url_of(host, port))
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())


def url_of(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}/"


class ConsoleThread:
    """The console in a thread beside a run; `start` returns once it listens (or raises)."""

    def __init__(self, state: ConsoleState, host: str, port: int, token: str | None) -> None:
        check_bind(host, token)
        self.args = (state, host, port, token)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="onceq-console", daemon=True)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(timeout=30)
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        state, host, port, token = self.args

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                runner = await start(make_app(state, token), host, port)
            except BaseException as exc:
                self._error = exc
                self._ready.set()
                return
            self._ready.set()
            try:
                await self._stop.wait()
            finally:
                await runner.cleanup()

        asyncio.run(main())

    def close(self) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # its loop already ended
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)


def beside_run(flows: Any, ledger: Any, host: str, port: int, token_file: Any) -> ConsoleThread:
    """`onceq run --console-port`: the console of a run's flows, listening once this returns."""
    console = ConsoleThread(ConsoleState(flows, ledger), host, port, read_token(token_file))
    console.start()
    return console
