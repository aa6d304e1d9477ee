"""Seed 000's orders as a flow: a directory queue, the ledger row and the `processed`
table the exercise reads.

`dirq consume` runs it when no flow is given (the exercise's layout and wording,
unchanged since 0.1.0). Apart from claims.py so that the directory queue's commands do
not import the RabbitMQ source.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from onceq._core.misconfig import GuardPolicy
from onceq._core.retry import BreakerPolicy, RetryPolicy
from onceq._exercise.presets import ORDERS
from onceq._exercise.processed_table import PROCESSED_TABLE
from onceq._flows.flow import DEFAULT_NAME, Flow
from onceq._sources.dirq.plugin import DirSource

__all__ = ["orders_flow"]


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
