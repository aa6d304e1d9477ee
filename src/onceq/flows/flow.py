"""A flow: a source, a message spec and an effect, recorded in one ledger under its name.

One model serves the three ways in (CLI flags, a TOML flow file, Python) and the
exercise presets, so every one of them runs through the same consume loop and the
same ledger code; only how the Flow is built differs.

    Flow(name, source, message, effect, sql)
      source   DirSource(path, workers) | RabbitSource(queue, …) | a Transport (tests)
      message  MessageSpec: where the id is, what is required and kept
      effect   HttpEffect | PythonEffect | a plain callable (= PythonEffect) | None
      sql      SqlEffect | a plain callable (= SqlEffect(function)) | None

With no call effect (`effect=None`) the ledger row, plus the SQL effect if any, is
the whole effect: the loop skips its pre-check and in-flight guard and the primary
key inside the commit decides (which is what makes an SQL effect exactly once).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceq.errors import UsageError

if TYPE_CHECKING:
    from onceq.core.consumer import Handler
    from onceq.core.effect import SqlEffect
    from onceq.core.message import MessageSpec
    from onceq.core.misconfig import GuardPolicy, MisconfigGuard
    from onceq.core.retry import BreakerPolicy, RetryPolicy

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
DEFAULT_NAME = "default"  # every CLI-flag run and preset: a migrated ledger keeps deduplicating
DEFAULT_PREFETCH = 5


@dataclass(frozen=True)
class DirSource:
    """A directory queue at `path`; `workers` consumers on it (each its own claim folder)."""

    path: Path
    workers: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))


@dataclass(frozen=True)
class RabbitSource:
    """A RabbitMQ queue by name; the exchange and dead-letter names are for `mq topology`.

    `url` None means EAI_AMQP_URL, else the default local broker.
    """

    queue: str
    exchange: str | None = None
    routing_key: str | None = None
    dead_letter_exchange: str | None = None
    dead_letter_queue: str | None = None
    url: str | None = None
    prefetch: int = DEFAULT_PREFETCH
    # "classic" | "quorum": the type `mq topology --flows` declares its queues with (None:
    # classic); the consumer checks the work queue's dead-letter arguments of that type.
    queue_type: str | None = None


def _default_spec() -> MessageSpec:
    from onceq.core.message import MessageSpec

    return MessageSpec()


@dataclass
class Flow:
    """One named flow. `validate()` says, in one line, what is wrong with it."""

    name: str = DEFAULT_NAME
    source: Any = None  # DirSource | RabbitSource | a Transport instance
    message: MessageSpec = field(default_factory=_default_spec)
    effect: Any = None  # HttpEffect | PythonEffect | Callable | None
    sql: Any = None  # SqlEffect | Callable | None
    retry: RetryPolicy | None = None  # None: RetryPolicy() (1 immediate, 5s 30s 2m 10m)
    breaker: BreakerPolicy | None = None  # None: on when there is a call effect
    guard: GuardPolicy | None = None  # None: GuardPolicy() (stop after 10 same failures)

    @property
    def kind(self) -> str:
        """'dirq', 'rabbitmq' or 'transport': what runs it, and the ledger's `source` tag."""
        if isinstance(self.source, DirSource):
            return "dirq"
        if isinstance(self.source, RabbitSource):
            return "rabbitmq"
        return "transport"

    def validate(self) -> Flow:
        """Refuse a flow that cannot run, before anything is consumed (UsageError)."""
        where = f"flow {self.name!r}" if isinstance(self.name, str) else "flow"
        if not isinstance(self.name, str) or not NAME.fullmatch(self.name):
            raise UsageError(
                f"{where}: a flow name is 1-64 of A-Z a-z 0-9 _ . - (starting with a letter"
                " or digit)"
            )
        from onceq.core.message import MessageSpec

        if not isinstance(self.message, MessageSpec):
            raise UsageError(f"{where}: message must be a MessageSpec")
        src = self.source
        if src is None:
            raise UsageError(f"{where}: no source (DirSource, RabbitSource or a transport)")
        if isinstance(src, DirSource):
            if not isinstance(src.workers, int) or src.workers < 1:
                raise UsageError(f"{where}: workers must be at least 1, not {src.workers}")
            if self.message.id_property:
                raise UsageError(f"{where}: id_property is a RabbitMQ property; a file has none")
        elif isinstance(src, RabbitSource):
            if not isinstance(src.queue, str) or not src.queue:
                raise UsageError(f"{where}: a RabbitMQ source needs a queue name")
            if not isinstance(src.prefetch, int) or not 1 <= src.prefetch <= 65535:
                raise UsageError(f"{where}: prefetch must be 1-65535, not {src.prefetch}")
        elif not (hasattr(src, "deliveries") and hasattr(src, "settle")):
            raise UsageError(f"{where}: source {type(src).__name__} is not a transport")
        if self.effect is not None and not callable(self.effect):
            raise UsageError(f"{where}: effect must be HttpEffect, PythonEffect or a callable")
        if self.sql is not None:
            from onceq.core.effect import SqlEffect

            if not (isinstance(self.sql, SqlEffect) or callable(self.sql)):
                raise UsageError(f"{where}: sql must be an SqlEffect or a callable (tx, doc)")
        from onceq.core.retry import BreakerPolicy, RetryPolicy

        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise UsageError(f"{where}: retry must be a RetryPolicy")
        if self.breaker is not None and not isinstance(self.breaker, BreakerPolicy):
            raise UsageError(f"{where}: breaker must be a BreakerPolicy")
        from onceq.core.misconfig import GuardPolicy

        if self.guard is not None and not isinstance(self.guard, GuardPolicy):
            raise UsageError(f"{where}: guard must be a GuardPolicy")
        return self

    def retry_policy(self) -> RetryPolicy:
        """The flow's retry policy: its own, else the default (1 immediate + tiers)."""
        from onceq.core.retry import RetryPolicy

        return self.retry if self.retry is not None else RetryPolicy()

    def breaker_policy(self) -> BreakerPolicy:
        """The flow's breaker: its own, else on for a call effect (a partner that can be
        down) and off without one (the ledger is not a partner)."""
        from onceq.core.retry import BreakerPolicy

        if self.breaker is not None:
            return self.breaker
        return BreakerPolicy() if self.effect is not None else BreakerPolicy.off()

    def guard_policy(self) -> GuardPolicy:
        """The flow's misconfiguration guard: its own, else on (onceq.core.misconfig)."""
        from onceq.core.misconfig import GuardPolicy

        return self.guard if self.guard is not None else GuardPolicy()

    def misconfig_guard(self) -> MisconfigGuard | None:
        """A fresh guard for one consumer's run; None when the flow's is off."""
        from onceq.core.misconfig import MisconfigGuard, Tally

        policy = self.guard_policy()
        if not policy.enabled:
            return None
        url = getattr(self.effect, "url", None)
        return MisconfigGuard(
            policy,
            url=url if isinstance(url, str) else None,
            id_field=self.message.id_field,
            tally=policy.shared or Tally(),
        )

    def handler(self) -> Handler | None:
        """The loop's handler for the call effect; None when the ledger row is the effect."""
        from onceq.core.effect import PythonEffect
        from onceq.effects.http import HttpEffect

        if self.effect is None:
            return None
        if isinstance(self.effect, HttpEffect | PythonEffect):
            return self.effect
        return PythonEffect(self.effect)

    def sql_effect(self) -> SqlEffect | None:
        from onceq.core.effect import SqlEffect

        if self.sql is None or isinstance(self.sql, SqlEffect):
            return self.sql
        return SqlEffect(function=self.sql)


def open_ledger(flow: Flow, target: str | Path, source: str, *, create: bool = True) -> Any:
    """The ledger at `target` (a path or a postgresql:// URL), scoped to this flow (its
    dedup rows, its SQL effect): `onceq.ledger.target.open_ledger`, the one place that
    tells an SQLite ledger from a PostgreSQL one."""
    from onceq.ledger.target import open_ledger as open_target

    return open_target(target, source, flow=flow.name, sql=flow.sql_effect(), create=create)


async def close_effect(handler: Any) -> None:
    """Close what an effect holds (an HTTP session): it belongs to one run's loop."""
    aclose: Callable[[], Any] | None = getattr(handler, "aclose", None)
    if aclose is not None:
        await aclose()


# --- the exercise presets, as flows ---------------------------------------------------


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
    import dataclasses

    from onceq.exercise.presets import ORDERS
    from onceq.exercise.processed_table import PROCESSED_TABLE

    spec = ORDERS
    changes: dict[str, Any] = {}
    if required is not None:
        changes["required"] = tuple(required)
    if max_bytes is not None:
        changes["max_bytes"] = max_bytes
    if changes:
        spec = dataclasses.replace(spec, **changes)
    from onceq.core.misconfig import GuardPolicy
    from onceq.core.retry import BreakerPolicy, RetryPolicy

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
    from onceq.exercise.presets import CLAIMS, claims_http
    from onceq.exercise.processed_table import PROCESSED_TABLE
    from onceq.sources.amqp import topology

    source = RabbitSource(
        topology.QUEUE,
        exchange=topology.EXCHANGE,
        routing_key=topology.ROUTING_KEY,
        dead_letter_exchange=topology.DLX,
        dead_letter_queue=topology.DEAD_QUEUE,
        url=url,
        prefetch=prefetch,
    )
    from onceq.core.misconfig import GuardPolicy

    effect = claims_http(claim_url, timeout=timeout, concurrency=prefetch)
    # The exercise's rule: every rejected claim dead-lettered, the run goes on.
    guard = GuardPolicy.exercise_rule()
    return Flow(DEFAULT_NAME, source, CLAIMS, effect, PROCESSED_TABLE, guard=guard)
