"""The /metrics and /healthz server: aiohttp on the consumer's own event loop.

Why aiohttp on the loop rather than prometheus_client's threaded server:
- /healthz then answers only while the loop turns: a consumer whose loop is stuck
  (a blocking call, a busy loop) stops answering, which is what a container runtime's
  liveness probe must see; a server thread would keep saying 200 for a dead consumer;
- the collector reads the consumer's counters on the thread that writes them, so a
  scrape never sees a half-updated Counter and the loop takes no lock;
- aiohttp is already onceq's HTTP library (the effect's client, the partner stub).
A scrape costs the loop the text of a few dozen samples; the queue depths it serves
are cached (onceq.ops.metrics_queues), so a scrape never reads a folder or the broker.

The socket is bound by `bind_socket` BEFORE anything else happens (before the queue
is checked, the ledger opened or a delivery taken), synchronously, so a port in use
refuses the run with one line and exit 4 (Conflict) and nothing is consumed or created.
The --workers parent serves the same app from a thread of its own (it has no loop:
it waits for its children), after the children are forked.
"""

from __future__ import annotations

import errno
import json
import socket
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from onceq.errors import Conflict, UsageError

__all__ = ["MetricsServer", "bind_socket", "host_port"]


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or one line saying why not.

    In use → Conflict (exit 4): another process holds the port (often a second
    consumer started with the same --metrics-port). Any other refusal (an address
    that is not this host's, a port below 1024 without the right) → UsageError (2).
    """
    where = host_port(host, port)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"{where}: cannot serve metrics: {exc.strerror}") from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        # SO_REUSEADDR: a consumer restarted at once may bind again while the old
        # connections sit in TIME_WAIT; on Linux it never lets two listeners share a port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(64)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise Conflict(f"{where}: cannot serve metrics: the port is in use") from None
        raise UsageError(f"{where}: cannot serve metrics: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


class MetricsServer:
    """Serves `registry` at /metrics and `health()` at /healthz on a bound socket."""

    def __init__(
        self,
        registry: CollectorRegistry,
        health: Callable[[], tuple[bool, dict[str, Any]]],
    ) -> None:
        self.registry = registry
        self.health = health
        self._runner: web.AppRunner | None = None

    async def start(self, sock: socket.socket) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        # No access log (a scrape every 15 s is not news); a short shutdown: a scrape
        # under way at the end is answered or dropped within a second.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    async def aclose(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def _metrics(self, _request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _request: web.Request) -> web.Response:
        ok, body = self.health()
        return web.Response(
            status=200 if ok else 503,
            text=json.dumps(body, sort_keys=True) + "\n",
            content_type="application/json",
        )
