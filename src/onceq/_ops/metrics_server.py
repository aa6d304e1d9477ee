"""The /metrics and /healthz server: aiohttp on the consumer's own event loop.

Why aiohttp on the loop rather than prometheus_client's threaded server:
- /healthz then answers only while the loop turns: a consumer whose loop is stuck
  (a blocking call, a busy loop) stops answering, which is what a container runtime's
  liveness probe must see; a server thread would keep saying 200 for a dead consumer;
- the collector reads the consumer's counters on the thread that writes them, so a
  scrape never sees a half-updated Counter and the loop takes no lock;
- aiohttp is already onceq's HTTP library (the effect's client, the partner stub).
A scrape costs the loop the text of a few dozen samples; the queue depths it serves
are cached (onceq._ops.metrics_queues), so a scrape never reads a folder or the broker.

The socket is bound (onceq._ops.metrics_port) BEFORE anything else happens (before the queue
is checked, the ledger opened or a delivery taken), synchronously, so a port in use
refuses the run with one line and exit 4 (Conflict) and nothing is consumed or created.
The --workers parent serves the same app from a thread of its own (it has no loop:
it waits for its children), after the children are forked.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from onceq._ops.metrics import new_registry
from onceq._ops.metrics_snapshot import FlowMetrics

__all__ = ["MetricsServer"]


class MetricsServer:
    """Serves the `flows()` metrics (onceq's own registry) at /metrics and `health()`
    at /healthz on a bound socket."""

    def __init__(
        self,
        flows: Callable[[], Iterable[FlowMetrics]],
        health: Callable[[], tuple[bool, dict[str, Any]]],
    ) -> None:
        self.registry = new_registry(flows)
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
