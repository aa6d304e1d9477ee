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

from onceq._core.effect import PythonEffect, SqlEffect
from onceq._core.message import MessageSpec
from onceq._core.misconfig import GuardPolicy, MisconfigGuard, Tally
from onceq._core.retry import BreakerPolicy, RetryPolicy
from onceq._effects.http import HttpEffect
from onceq._ledger.target import open_ledger as open_target
from onceq._sources import registry
from onceq._sources.registry import SourceType
from onceq.errors import UsageError

if TYPE_CHECKING:
    from onceq._core.consumer import Handler

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
DEFAULT_NAME = "default"  # every CLI-flag run and preset: a migrated ledger keeps deduplicating


@dataclass
class Flow:
    """One named flow. `validate()` says, in one line, what is wrong with it."""

    name: str = DEFAULT_NAME
    source: Any = None  # DirSource | RabbitSource | a Transport instance
    message: MessageSpec = field(default_factory=MessageSpec)
    effect: Any = None  # HttpEffect | PythonEffect | Callable | None
    sql: Any = None  # SqlEffect | Callable | None
    retry: RetryPolicy | None = None  # None: RetryPolicy() (1 immediate, 5s 30s 2m 10m)
    breaker: BreakerPolicy | None = None  # None: on when there is a call effect
    guard: GuardPolicy | None = None  # None: GuardPolicy() (stop after 10 same failures)

    @property
    def kind(self) -> str:
        """'dirq', 'rabbitmq', 'transport', …: its source type's, and the ledger's `source` tag."""
        t = registry.of(self.source)
        return t.kind if t is not None else "transport"  # not one: validate() says so

    def source_type(self) -> SourceType:
        """What runs this flow's source (onceq._sources.registry); UsageError for none."""
        t = registry.of(self.source)
        if t is None:
            where = f"flow {self.name!r}" if isinstance(self.name, str) else "flow"
            raise UsageError(f"{where}: source {type(self.source).__name__} is not a transport")
        return t

    def validate(self) -> Flow:
        """Refuse a flow that cannot run, before anything is consumed (UsageError)."""
        where = f"flow {self.name!r}" if isinstance(self.name, str) else "flow"
        if not isinstance(self.name, str) or not NAME.fullmatch(self.name):
            raise UsageError(
                f"{where}: a flow name is 1-64 of A-Z a-z 0-9 _ . - (starting with a letter"
                " or digit)"
            )
        if not isinstance(self.message, MessageSpec):
            raise UsageError(f"{where}: message must be a MessageSpec")
        src = self.source
        if src is None:
            raise UsageError(f"{where}: no source (DirSource, RabbitSource or a transport)")
        problem = self.source_type().validate(src, self, where)
        if problem is not None:
            raise UsageError(f"{where}: {problem}")
        if self.effect is not None and not callable(self.effect):
            raise UsageError(f"{where}: effect must be HttpEffect, PythonEffect or a callable")
        if self.sql is not None and not (isinstance(self.sql, SqlEffect) or callable(self.sql)):
            raise UsageError(f"{where}: sql must be an SqlEffect or a callable (tx, doc)")
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise UsageError(f"{where}: retry must be a RetryPolicy")
        if self.breaker is not None and not isinstance(self.breaker, BreakerPolicy):
            raise UsageError(f"{where}: breaker must be a BreakerPolicy")
        if self.guard is not None and not isinstance(self.guard, GuardPolicy):
            raise UsageError(f"{where}: guard must be a GuardPolicy")
        return self

    def retry_policy(self) -> RetryPolicy:
        """The flow's retry policy: its own, else the default (1 immediate + tiers)."""
        return self.retry if self.retry is not None else RetryPolicy()

    def breaker_policy(self) -> BreakerPolicy:
        """The flow's breaker: its own, else on for a call effect (a partner that can be
        down) and off without one (the ledger is not a partner)."""
        if self.breaker is not None:
            return self.breaker
        return BreakerPolicy() if self.effect is not None else BreakerPolicy.off()

    def guard_policy(self) -> GuardPolicy:
        """The flow's misconfiguration guard: its own, else on (onceq._core.misconfig)."""
        return self.guard if self.guard is not None else GuardPolicy()

    def misconfig_guard(self) -> MisconfigGuard | None:
        """A fresh guard for one consumer's run; None when the flow's is off."""
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
        if self.effect is None:
            return None
        if isinstance(self.effect, HttpEffect | PythonEffect):
            return self.effect
        return PythonEffect(self.effect)

    def sql_effect(self) -> SqlEffect | None:
        if self.sql is None or isinstance(self.sql, SqlEffect):
            return self.sql
        return SqlEffect(function=self.sql)


def open_ledger(flow: Flow, target: str | Path, source: str, *, create: bool = True) -> Any:
    """The ledger at `target` (a path or a postgresql:// URL), scoped to this flow (its
    dedup rows, its SQL effect): `onceq._ledger.target.open_ledger`, the one place that
    tells an SQLite ledger from a PostgreSQL one."""
    return open_target(target, source, flow=flow.name, sql=flow.sql_effect(), create=create)


async def close_effect(handler: Any) -> None:
    """Close what an effect holds (an HTTP session): it belongs to one run's loop."""
    aclose: Callable[[], Any] | None = getattr(handler, "aclose", None)
    if aclose is not None:
        await aclose()
