"""How deep a flow's queue is, for /metrics: read in the background, served from a cache.

A scrape never touches the queue: each flow's reader (its source type's
`depth_reader`: onceq._sources.dirq.scan.DirScan, onceq._sources.amqp.depths.RabbitDepths)
refreshes on its own every few seconds and a scrape reads the last figures. A reader
has `messages()` (state -> count, the `state` label of onceq_queue_messages),
`oldest_age()` (seconds, or None) and `run(stop)`.
"""

from __future__ import annotations

from typing import Any

from onceq._sources import registry


def reader_for(flow: Any, transport: Any) -> Any | None:
    """The flow's queue reader (its source type's), or None: a library transport, or a
    RabbitMQ flow whose depth reader is not available."""
    source_type = registry.of(flow.source)
    return None if source_type is None else source_type.depth_reader(flow, transport)
