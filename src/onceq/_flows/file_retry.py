"""A flow's retry policy and circuit breaker as a flow file writes them.

    [flows.invoices]
    retry = "exercise"              # or "default", "none", or the table:
    [flows.invoices.retry]
    immediate = 1                   # retries at once
    delays = ["5s", "30s", "2m"]    # then one try after each (ms, s, m, h; a number is s)
    [flows.invoices.breaker]        # or breaker = false
    enabled = true
    failures = 5                    # transient failures in a row that open it
    probe = "1s"                    # first probe, doubling …
    max_probe = "30s"               # … up to this
    [flows.invoices.guard]          # or guard = false
    enabled = true
    failures = 10                   # the first N messages all failing alike stop the run

A key left out of a table keeps the default (`onceq._core.retry`). No `retry` key: the
default policy; no `breaker` key: on when the flow has a call effect; no `guard` key:
the misconfiguration guard on, stopping after 10 (onceq._core.misconfig). Each mistake is
one `FILE: line N: flows.NAME.retry.delays: why` line (`flowfile_keys.Mistakes`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from onceq._core.keys import Mistakes, get, toml_type
from onceq._core.misconfig import MAX_FAILURES, GuardPolicy
from onceq._core.retry import BreakerPolicy, RetryPolicy, delay_label, parse_duration
from onceq.errors import UsageError

POLICY_NAMES = ("default", "exercise", "none")
RETRY_KEYS = {"immediate", "delays"}
BREAKER_SETTINGS = ("failures", "probe", "max_probe")  # what `enabled = false` makes moot
BREAKER_KEYS = {"enabled", *BREAKER_SETTINGS}
GUARD_KEYS = {"enabled", "failures"}


def retry_of(
    t: dict[str, Any], m: Mistakes, where: str, base: RetryPolicy | None = None
) -> RetryPolicy | None:
    """The flow's `retry` (a policy's name or a table over `base`, by default the default
    policy); None when absent or wrong."""
    if "retry" not in t:
        return None
    key = f"{where}.retry"
    value = t["retry"]
    if isinstance(value, str):
        if value not in POLICY_NAMES:
            m.add(key, f"must be {', '.join(map(repr, POLICY_NAMES))} or a table, not {value!r}")
            return None
        return RetryPolicy.named(value)
    if not isinstance(value, dict):
        m.add(key, f"must be a policy's name (text) or a table, not {toml_type(value)}")
        return None
    before = len(m)
    _unknown(value, RETRY_KEYS, m, key)
    changes: dict[str, Any] = {}
    immediate = get(value, "immediate", int, m, key)
    if immediate is not None:
        if not 0 <= immediate <= 100:
            m.add(f"{key}.immediate", f"must be 0-100, not {immediate}")
        changes["immediate"] = immediate
    delays = get(value, "delays", list, m, key)
    if delays is not None:
        changes["delays"] = _durations(delays, f"{key}.delays", m)
    if len(m) > before:
        return None
    try:
        return dataclasses.replace(base or RetryPolicy(), **changes)
    except UsageError as exc:  # two delays the same, more than 20
        m.add(f"{key}.delays", str(exc).removeprefix("retry: "))
        return None


def _unknown(table: dict[str, Any], keys: set[str], m: Mistakes, key: str) -> None:
    for k in table:
        if k not in keys:
            m.add(f"{key}.{k}", f"unknown key (expected: {', '.join(sorted(keys))})")


def _durations(items: list[Any], key: str, m: Mistakes) -> tuple[float, ...]:
    out = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            m.add(key, f'each delay is a duration ("5s", "2m") or seconds, not {toml_type(item)}')
            continue
        try:
            seconds = parse_duration(item, "delay")
        except UsageError:
            m.add(key, f'{item!r}: not a duration (e.g. "5s", "2m", "500ms")')
            continue
        if seconds <= 0:
            immediate = m.setting(key.rpartition(".")[0] + ".immediate")
            m.add(key, f"{item!r}: a delay must be more than 0 (immediate retries are {immediate})")
            continue
        out.append(seconds)
    return tuple(out)


def _switch_table(t: dict[str, Any], name: str, m: Mistakes, where: str) -> Any:
    """`breaker`/`guard`: true/false or a table (returned as it is); None when absent or wrong."""
    value = t.get(name)
    if value is not None and not isinstance(value, bool | dict):
        m.add(f"{where}.{name}", f"must be a table or true/false, not {toml_type(value)}")
        return None
    return value


def _off(m: Mistakes, key: str, given: list[str], enabled: bool | None, why: str) -> None:
    """A setting of a switch that ends up off would be silently ignored: refuse it (the first)."""
    if given:
        fix = m.setting(f"{key}.enabled", False) if enabled is False else why
        m.add(f"{key}.{given[0]}", f"the {key.rpartition('.')[2]} is off ({fix})")


def breaker_of(
    t: dict[str, Any], m: Mistakes, where: str, base: BreakerPolicy
) -> BreakerPolicy | None:
    """The flow's `breaker` (a table over `base`, or true/false); None when absent or wrong.

    A table without `enabled` keeps `base`'s (on for a flow with a call effect)."""
    value = _switch_table(t, "breaker", m, where)
    if value is None or isinstance(value, bool):
        return None if value is None else BreakerPolicy() if value else BreakerPolicy.off()
    key = f"{where}.breaker"
    before = len(m)
    _unknown(value, BREAKER_KEYS, m, key)
    enabled = get(value, "enabled", bool, m, key)
    on = base.enabled if enabled is None else enabled
    given = [k for k in BREAKER_SETTINGS if k in value]
    if not on:
        add = m.setting(f"{key}.enabled", True)
        _off(m, key, given, enabled, f"this flow has no call effect; add {add}")
    changes: dict[str, Any] = {"enabled": on}
    if (failures := get(value, "failures", int, m, key)) is not None:
        if not 1 <= failures <= 10_000:
            m.add(f"{key}.failures", f"must be 1-10000, not {failures}")
        changes["failures"] = failures
    for name in ("probe", "max_probe"):
        given_value = value.get(name)
        if given_value is None:
            continue
        seconds = _duration(given_value, f"{key}.{name}", m)
        if seconds is not None:
            changes[name] = seconds
    if len(m) > before:
        return None
    try:
        return dataclasses.replace(base, **changes)
    except UsageError as exc:  # max_probe below probe
        m.add(f"{key}.max_probe", str(exc).removeprefix("breaker: "))
        return None


def _duration(given: Any, key: str, m: Mistakes) -> float | None:
    if isinstance(given, bool) or not isinstance(given, str | int | float):
        m.add(key, f'must be a duration ("1s") or seconds, not {toml_type(given)}')
        return None
    try:
        seconds = parse_duration(given, key)
    except UsageError:
        m.add(key, f'{given!r}: not a duration (e.g. "1s", "30s", "500ms")')
        return None
    if seconds <= 0:
        m.add(key, f"{given!r}: must be more than 0")
        return None
    return seconds


def guard_of(t: dict[str, Any], m: Mistakes, where: str, base: GuardPolicy) -> GuardPolicy | None:
    """The flow's `guard` (a table over `base`, or true/false); None when absent or wrong.

    A table turns it on unless it says `enabled = false`: a number of failures is meant
    to count (a preset's guard is off, and keeps the exercise's exit rule)."""
    value = _switch_table(t, "guard", m, where)
    if value is None or isinstance(value, bool):
        return None if value is None else GuardPolicy() if value else GuardPolicy.off()
    key = f"{where}.guard"
    before = len(m)
    _unknown(value, GUARD_KEYS, m, key)
    enabled = get(value, "enabled", bool, m, key)
    failures = get(value, "failures", int, m, key)
    if failures is not None and not 1 <= failures <= MAX_FAILURES:
        m.add(f"{key}.failures", f"must be 1-{MAX_FAILURES}, not {failures}")
    if enabled is False:
        _off(m, key, [k for k in ("failures",) if k in value], enabled, "")
    if len(m) > before:
        return None
    changes: dict[str, Any] = {"enabled": enabled is not False}
    if failures is not None:
        changes["failures"] = failures
    return dataclasses.replace(base, **changes)


def describe(flow: Any) -> dict[str, Any]:
    """The policies a flow runs with, for `onceq check` (its defaults filled in)."""
    retry, breaker, guard = flow.retry_policy(), flow.breaker_policy(), flow.guard_policy()
    return {
        "guard": {"enabled": True, "failures": guard.failures}
        if guard.enabled
        else {"enabled": False},
        "retry": {"immediate": retry.immediate, "delays": [delay_label(d) for d in retry.delays]},
        "breaker": {
            "enabled": breaker.enabled,
            "failures": breaker.failures,
            "probe": delay_label(breaker.probe),
            "max_probe": delay_label(breaker.max_probe),
        }
        if breaker.enabled
        else {"enabled": False},
    }


def summary(flow: Any) -> str:
    """`retry 1 + 5s,30s,2m,10m, breaker 5 in a row` in one phrase, for `onceq check`."""
    d = describe(flow)
    r, b = d["retry"], d["breaker"]
    tiers = ",".join(r["delays"]) or "no delays"
    brk = f"breaker {b['failures']} in a row" if b["enabled"] else "no breaker"
    g = d["guard"]
    grd = f"guard {g['failures']}" if g["enabled"] else "no guard"
    return f"retry {r['immediate']} + {tiers}, {brk}, {grd}"
