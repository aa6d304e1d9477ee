"""The two exercises as flows: seed 000's orders over a directory queue, seed 001's
claims over RabbitMQ, each with the `processed` table the exercises read.

`dirq consume` and `mq consume` run these when no flow is given (the exercise's
layouts and wording, unchanged since 0.1.0); every other flow is the user's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from onceq._core.misconfig import GuardPolicy
from onceq._core.retry import BreakerPolicy, RetryPolicy
from onceq._exercise.presets import CLAIMS, ORDERS, claims_http
from onceq._exercise.processed_table import PROCESSED_TABLE
from onceq._flows.flow import DEFAULT_NAME, Flow
from onceq._sources.amqp import topology
from onceq._sources.amqp.plugin import DEFAULT_PREFETCH, RabbitSource
from onceq._sources.dirq.plugin import DirSource

__all__ = ["claims_flow", "orders_flow"]


def orders_flow(
    qdir: str | Path,
    *,
    workers: int = 1,
    required: tuple[str, ...] | None = None,
    max_bytes: int | None = None,
) -> Flow:
    """Seed 000's orders over a directory queue: the ledger row plus the `processed` table.

    `required` and `max_bytes` are `dirq consume --required/--max-bytes` on the preset.
    """
    spec = ORDERS
    changes: dict[str, Any] = {}
    if required is not None:
        changes["required"] = tuple(required)
    if max_bytes is not None:
        changes["max_bytes"] = max_bytes
    if changes:
        spec = dataclasses.replace(spec, **changes)
    # The exercise's rule: a file that fails is quarantined at once (its only effect
    # is the ledger row, so a failure is the message's own, never a partner's), and
    # every bad file is quarantined while the run goes on (no misconfiguration guard).
    return Flow(
        DEFAULT_NAME,
        DirSource(Path(qdir), workers),
        spec,
        None,
        PROCESSED_TABLE,
        retry=RetryPolicy.none(),
        breaker=BreakerPolicy.off(),
        guard=GuardPolicy.exercise_rule(),
    )


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
