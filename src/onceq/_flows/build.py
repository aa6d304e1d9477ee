"""The one builder of a Flow from configuration: a mapping of flow keys → Flow.

A flow file's `[flows.NAME]` table and the command line's flags (turned into the same
keys by onceq._cli.flow_flags) are both read here, every mistake collected in a
`Mistakes` by its key: the file writes `FILE: line N: flows.NAME.http.url: why`, a
command line `--url …: why`, each from the key the builder named. So a key is read,
checked and explained once, whichever way it was written.

    build(name, table, where, base, m)  the whole flow (a file's table, the own-flow flags)
    policies(flow, table, where, m)     retry/breaker/guard over a built flow (a preset's)

A source's keys (`path`, `queue`, …) are its source type's (`SourceType.from_table`);
the others are the message spec's (`id_field` …), the effects' (`http`, `python`,
`sql`) and the policies' (`retry`, `breaker`, `guard`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from onceq._core.keys import Mistakes, get
from onceq._core.retry import BreakerPolicy
from onceq._flows.file_effects import effect_of, spec_of, sql_of
from onceq._flows.file_keys import flow_keys
from onceq._flows.file_retry import breaker_of, guard_of, retry_of
from onceq._flows.flow import NAME, Flow
from onceq._sources import registry

__all__ = ["build", "policies"]

NAME_WHY = "a flow name is 1-64 of A-Z a-z 0-9 _ . - (starting with a letter or digit)"


def build(name: str, t: dict[str, Any], where: str, base: Path, m: Mistakes) -> Flow | None:
    """The flow `t` describes (its keys as a [flows.NAME] table has them), or None with
    its mistakes in `m` (keys under `where`). Relative paths and imports: `base`'s."""
    before = len(m)
    if not NAME.fullmatch(name):
        m.add(where, NAME_WHY)
    keys = flow_keys()
    for k in t:
        if k not in keys:
            m.add(f"{where}.{k}", "unknown key")
    kind = get(t, "source", str, m, where, required=True)
    source: Any = None
    if kind is not None:
        stype = registry.named(kind)
        if stype is None or not stype.public:
            m.add(f"{where}.source", f"must be {_one_of(registry.kinds())}, not {kind!r}")
        else:
            # Another source's key: the wrong source, named. One line per key, however
            # many kinds take it (a broker's `prefetch` is RabbitMQ's and NATS's).
            owners: dict[str, list[str]] = {}
            for other in registry.types():
                for k in (other.file_keys - stype.file_keys) & t.keys():
                    owners.setdefault(k, []).append(other.kind)
            for k in sorted(owners):
                kinds = " or ".join(owners[k])
                m.add(f"{where}.{k}", f"is for a {kinds} source, not a {kind} one")
            source = stype.from_table(t, where, base, m)
    spec = spec_of(t, m, where)
    effect = effect_of(t, m, where, base)
    sql = sql_of(t, m, where, base)
    flow = Flow(name, source, spec, effect, sql)
    # A call effect with a mistake is still a call effect: its breaker's base is on, so
    # a [breaker] setting beside a mistyped [http] is not refused a second time.
    call = effect is not None or "http" in t or "python" in t
    got = _policies(flow, t, where, m, call)
    if len(m) > before or got is None:
        return None
    return got


def policies(flow: Flow, t: dict[str, Any], where: str, m: Mistakes) -> Flow | None:
    """`flow` with the `retry`, `breaker` and `guard` of `t` over its own (a copy; the
    flow itself when `t` has none), or None with the mistakes in `m`."""
    return _policies(flow, t, where, m, flow.effect is not None)


def _policies(flow: Flow, t: dict[str, Any], where: str, m: Mistakes, call: bool) -> Flow | None:
    before = len(m)
    base = flow.breaker if flow.breaker is not None else BreakerPolicy(enabled=call)
    changes: dict[str, Any] = {
        "retry": retry_of(t, m, where, flow.retry_policy()),
        "breaker": breaker_of(t, m, where, base),
        "guard": guard_of(t, m, where, flow.guard_policy()),
    }
    if len(m) > before:
        return None
    changes = {k: v for k, v in changes.items() if v is not None}
    return dataclasses.replace(flow, **changes) if changes else flow


def _one_of(kinds: list[str]) -> str:
    """`"a"`, `"a" or "b"`, `"a", "b" or "c"`."""
    quoted = [f'"{k}"' for k in kinds]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
