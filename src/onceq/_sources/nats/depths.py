"""A NATS flow's depths, from its durable consumer's info (`onceq status`, /metrics).

pending        stored, not yet delivered to the consumer
ack_pending    delivered and not yet acked (in flight, or NAKed with a delay)
redelivering   waiting to be delivered again (NAKed, or past its AckWait)
dead           dead letters kept in the flow's dead-letter stream

`labelled` gives the console these four as its columns, under these names.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from onceq._core.waits import wait
from onceq._sources.nats.connect import API_TIMEOUT, boundary, close_quietly, connect
from onceq._sources.nats.names import dead_subject_of, nats_url

log = logging.getLogger("onceq.nats.depths")


async def consumer_depths(source: Any) -> dict[str, Any]:
    import nats.js.errors as jse

    url = nats_url(source.url)
    nc = await connect(url)
    try:
        js = nc.jetstream(timeout=API_TIMEOUT)
        with boundary(url, f"consumer {source.durable} on stream {source.stream}"):
            info = await js.consumer_info(source.stream, source.durable)
        out: dict[str, Any] = {
            "stream": source.stream,
            "durable": source.durable,
            "pending": info.num_pending or 0,
            "ack_pending": info.num_ack_pending or 0,
            "redelivering": info.num_redelivered or 0,
            "waiting_pulls": info.num_waiting or 0,
        }
        dead = source.dead_subject or dead_subject_of(source.stream)
        try:
            with boundary(url):
                name = await js.find_stream_name_by_subject(dead)
                dead_info = await js.stream_info(name, subjects_filter=dead)
            subjects = dead_info.state.subjects or {}
            out["dead"] = int(subjects.get(dead, 0))
        except (jse.NotFoundError, Exception):
            out["dead"] = None
        # The shape every queue-backed source gives `onceq status` (RabbitMQ's: one row
        # per queue with its state), so its table shows a NATS flow without knowing it.
        out["kind"] = "nats"
        out["queues"] = [
            {
                "state": "ready",
                "name": f"{source.stream}/{source.durable}",
                "exists": True,
                "ready": out["pending"],
                "unacked": out["ack_pending"],
                "consumers": None,
            },
            {
                "state": "dead",
                "name": dead,
                "exists": out["dead"] is not None,
                "ready": out["dead"],
                "unacked": None,
                "consumers": None,
            },
        ]
        return out
    finally:
        await close_quietly(nc)


def labelled(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A flow's `onceq status` depths as the console's columns (the consumer's own words)."""
    return [
        {"key": "pending", "label": "pending", "value": doc.get("pending"), "unit": None},
        {
            "key": "ack_pending",
            "label": "ack pending",
            "value": doc.get("ack_pending"),
            "unit": None,
        },
        {
            "key": "redelivering",
            "label": "redelivering",
            "value": doc.get("redelivering"),
            "unit": None,
        },
        {"key": "dead", "label": "dead", "value": doc.get("dead"), "unit": None},
    ]


class NatsDepths:
    """A NATS flow's depths for /metrics, read every `every` seconds over the running
    consumer's own connection (one small API request; a scrape reads the last figures)."""

    def __init__(self, transport: Any, every: float = 5.0) -> None:
        self.transport = transport
        self.every = every
        self._last: dict[str, int] = {}

    def messages(self) -> dict[str, int]:
        return dict(self._last)

    def oldest_age(self) -> float | None:
        return None  # the consumer's info tells no message's age

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self._read()
            await wait(stop, self.every)

    async def _read(self) -> None:
        t = self.transport
        js = getattr(t, "_js", None)
        if js is None or not t.connected:
            return  # the figures stay the last read: /healthz says the connection is lost
        try:
            info = await js.consumer_info(t.stream, t.durable)
            out = {
                "ready": info.num_pending or 0,
                "unacked": info.num_ack_pending or 0,
                "redelivering": info.num_redelivered or 0,
            }
            name = await js.find_stream_name_by_subject(t.dead_subject)
            state = (await js.stream_info(name, subjects_filter=t.dead_subject)).state
            out["dead"] = int((state.subjects or {}).get(t.dead_subject, 0))
        except Exception as exc:  # asked again next period
            log.debug("depths: %s", type(exc).__name__, extra={"event": "depths-failed"})
            return
        self._last = out
