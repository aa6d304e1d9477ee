"""What a running consumer shows the outside: metrics, /healthz, JSON logs, its state.

    telemetry = Telemetry(OpsOptions(metrics_port=9464, log_format="json"))
    await telemetry.start()                      # binds /metrics and /healthz
    with telemetry.track(flow, consumer, transport):
        await consumer.run()
    await telemetry.aclose()

One `Telemetry` per process (a process may run several flows: `onceq run`); each
consume path (`dirq.run.consume_flow`, `amqp.consume.consume_flow`, the runner's
transport flows) registers the consumer it runs with `track`, so every flow is
watched the same way whichever command started it. Without options it does nothing
and costs nothing: a consumer nobody watches pays for no metric.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["LOG_FORMATS", "OpsOptions", "Telemetry"]

LOG_FORMATS = ("human", "json")


@dataclass(frozen=True)
class OpsOptions:
    """How a long-running command is watched: `--metrics-port/--metrics-host/--log-format`."""

    metrics_port: int | None = None  # None: no metrics server
    metrics_host: str = "127.0.0.1"  # loopback unless the operator opens it on purpose
    log_format: str = "human"  # human | json (one JSON object a line)
    log_level: str = "warning"


class Telemetry:
    """The process's metrics registry, its /metrics + /healthz server and the flows it watches."""

    def __init__(self, opts: OpsOptions | None = None) -> None:
        self.opts = opts or OpsOptions()

    async def start(self) -> None:
        """Bind the metrics server (when a port is set); idempotent."""

    @contextlib.contextmanager
    def track(self, flow: Any, consumer: Any, transport: Any) -> Iterator[None]:
        """Watch one flow's consumer while inside (metrics, health, published state)."""
        yield

    def stopping(self) -> None:
        """The process is stopping: /healthz answers 503 from now on."""

    async def aclose(self) -> None:
        """Stop the server (after the final scrape window)."""
