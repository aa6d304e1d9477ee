"""Seed 001's claims as a flow: RabbitMQ's claim.in, POST CLAIM/v1/claims and the
`processed` table the exercise reads.

`mq consume` runs it when no flow is given (the exercise's layout and wording,
unchanged since 0.1.0).
"""

from __future__ import annotations

from onceq._core.misconfig import GuardPolicy
from onceq._exercise.presets import CLAIMS, claims_http
from onceq._exercise.processed_table import PROCESSED_TABLE
from onceq._flows.flow import DEFAULT_NAME, Flow
from onceq._sources.amqp import topology
from onceq._sources.amqp.plugin import DEFAULT_PREFETCH, RabbitSource

__all__ = ["claims_flow"]


def claims_flow(
    claim_url: str,
    *,
    url: str | None = None,
    prefetch: int = DEFAULT_PREFETCH,
    timeout: float = 10.0,
) -> Flow:
    """Seed 001's claims: claim.in, POST CLAIM/v1/claims (201 only), the `processed` table."""
    source = RabbitSource(
        topology.QUEUE,
        exchange=topology.EXCHANGE,
        routing_key=topology.ROUTING_KEY,
        dead_letter_exchange=topology.DLX,
        dead_letter_queue=topology.DEAD_QUEUE,
        url=url,
        prefetch=prefetch,
    )
    effect = claims_http(claim_url, timeout=timeout, concurrency=prefetch)
    # The exercise's rule: every rejected claim dead-lettered, the run goes on.
    guard = GuardPolicy.exercise_rule()
    return Flow(DEFAULT_NAME, source, CLAIMS, effect, PROCESSED_TABLE, guard=guard)
