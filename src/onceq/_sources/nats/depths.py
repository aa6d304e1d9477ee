"""A NATS flow's depths, from its durable consumer's info (`onceq status`).

pending        stored, not yet delivered to the consumer
ack_pending    delivered and not yet acked (in flight, or NAKed with a delay)
redelivering   waiting to be delivered again (NAKed, or past its AckWait)
dead           dead letters kept in the flow's dead-letter stream
"""

from __future__ import annotations

from typing import Any

from onceq._sources.nats.connect import API_TIMEOUT, boundary, close_quietly, connect
from onceq._sources.nats.names import dead_subject_of, nats_url


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
        return out
    finally:
        await close_quietly(nc)
