"""One consumer in this process as /metrics, /healthz and the heartbeat see it.

`Live` answers /healthz for one consumer (its own stop, its source's problem asked of
the source type, its ledger) and gives the snapshot /metrics and a --workers child's
report read; `start_heartbeat` publishes its row in the ledger (onceq._ops.heartbeat).
"""

from __future__ import annotations

from typing import Any

from onceq._core.stats import Stats
from onceq._ops.metrics_snapshot import DONE, Snapshot
from onceq._sources.registry import of

__all__ = ["Live", "source_snapshot", "start_heartbeat"]


class Live:
    """One consumer in this process, as /metrics and /healthz see it."""

    def __init__(self, flow: Any, consumer: Any, transport: Any) -> None:
        self.flow = flow
        self.source_type = of(flow.source)
        self.consumer = consumer
        self.transport = transport
        self.durations: Any = None  # onceq._ops.metrics.Durations: the calls' histogram
        self.ended = False

    def problem(self) -> str | None:
        """Why this consumer is not healthy, or None."""
        c = self.consumer
        if self.ended:
            return DONE
        if c.stopping:
            return "stopping"
        st = self.source_type
        problem = st.problem(self.flow, self.transport) if st is not None else None
        if problem is not None:  # the broker's connection, the queue folder
            return problem
        if c.holds.ledger_away:
            return "ledger unavailable"
        return None

    def snapshot(self) -> Snapshot:
        c = self.consumer
        b = c.breaker
        return Snapshot(
            c.stats, c.in_flight, b.state if b else None, self.durations, self.problem()
        )


async def start_heartbeat(consumer: Any, transport: Any) -> Any:
    """One Heartbeat for this consumer on its own ledger (None for a ledger of a kind
    the heartbeat cannot write: a user's own object without a path or URL)."""
    # why: sqlite3 and the heartbeat's thread pool load only when a consumer runs (start-up)
    from onceq._ops.heartbeat import Heartbeat, consumer_state

    ledger = getattr(consumer, "ledger", None)
    target = getattr(ledger, "url", None) or getattr(ledger, "path", None)
    flow = getattr(ledger, "flow", None)
    if target is None or flow is None:
        return None
    heartbeat = Heartbeat(target, flow, consumer_state(consumer, transport))
    await heartbeat.start()
    return heartbeat


def source_snapshot(flow: Any) -> Snapshot:
    """The --workers parent's own look at the source (its folder), beside the children's."""
    st = of(flow.source)
    return Snapshot(Stats(), problem=st.problem(flow, None) if st is not None else None)
