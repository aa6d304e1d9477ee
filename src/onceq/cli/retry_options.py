"""The retry and breaker flags every consuming command shares (and `mq topology`'s tiers).

    --retry default|exercise|none    the base policy (default: the flow's own)
    --immediate-retries N            … with N immediate retries instead
    --retry-delays 5s,30s,2m,10m     … with these delayed tiers instead ("none": no tiers)
    --breaker/--no-breaker           the circuit breaker on or off
    --breaker-failures K             open after K transient failures in a row
    --breaker-probe DURATION         first probe after this long
    --breaker-max-probe DURATION     probe interval cap
    --guard/--no-guard               the misconfiguration guard on or off
    --guard-failures N               stop when the first N messages all fail alike

The flags only change what was given: a command's preset keeps its own policy (the
orders preset: no retry, no breaker, no guard) unless a flag says otherwise, so adding these
flags changed no existing run. The library decides (onceq.core.retry validates every
value); this module parses and names the flag in the one-line refusal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from onceq.errors import UsageError

if TYPE_CHECKING:
    from onceq.core.misconfig import GuardPolicy
    from onceq.core.retry import BreakerPolicy, RetryPolicy
    from onceq.flows.flow import Flow

F = TypeVar("F", bound=Callable[..., Any])

RETRY_KEYS = ("retry", "immediate_retries", "retry_delays")
BREAKER_KEYS = ("breaker", "breaker_failures", "breaker_probe", "breaker_max_probe")
GUARD_KEYS = ("guard", "guard_failures")
_BREAKER_SETTINGS = {
    "breaker_failures": "failures",
    "breaker_probe": "probe",
    "breaker_max_probe": "max_probe",
}


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _retry_opts() -> list[Callable[[F], F]]:
    return [
        click.option(
            "--retry",
            type=click.Choice(["default", "exercise", "none"]),
            help="Retry policy: default (1 immediate retry, then after 5s, 30s, 2m, 10m,"
            " then dead), exercise (1 immediate retry, then dead), none (dead at the"
            " first failure). Default: the command's own (see --help's text).",
        ),
        click.option(
            "--immediate-retries",
            type=click.IntRange(0, 100),
            metavar="N",
            help="Retries at once after a transient failure, before the delayed tiers.",
        ),
        click.option(
            "--retry-delays",
            metavar="LIST",
            help="Delayed retries after the immediate ones, e.g. 5s,30s,2m,10m"
            " (ms, s, m, h); 'none' for no delayed retry.",
        ),
    ]


def _breaker_opts() -> list[Callable[[F], F]]:
    return [
        click.option(
            "--breaker/--no-breaker",
            default=None,
            help="Circuit breaker: after K transient failures in a row, hold messages"
            " (no attempt spent) and probe the partner with one. Default: on with a"
            " call effect (--url, --claim).",
        ),
        click.option(
            "--breaker-failures",
            type=click.IntRange(1, 10_000),
            metavar="K",
            help="Transient failures in a row (different messages) that open the"
            " breaker (default 5).",
        ),
        click.option(
            "--breaker-probe",
            metavar="DURATION",
            help="First probe after this long while open, doubling (default 1s).",
        ),
        click.option(
            "--breaker-max-probe",
            metavar="DURATION",
            help="The longest wait between probes (default 30s).",
        ),
    ]


def _guard_opts() -> list[Callable[[F], F]]:
    return [
        click.option(
            "--guard/--no-guard",
            default=None,
            help="Misconfiguration guard: when the first N messages all fail permanently"
            " for the same reason (a missing field, 404, 401/403), stop (exit 10) before"
            " rejecting the rest, which stay untouched. Default: on, except for the"
            " exercise presets.",
        ),
        click.option(
            "--guard-failures",
            type=click.IntRange(1, 100_000),
            metavar="N",
            help="How many first messages failing alike stop the run (default 10).",
        ),
    ]


def retry_options(f: F | None = None, *, breaker: bool = True) -> Any:
    """Add the retry flags (and the breaker and guard flags unless `breaker=False`).

    `@retry_options` on a consuming command; `@retry_options(breaker=False)` where only
    the tiers matter (`mq topology` declares the tier queues, it runs no effect).
    """

    def decorate(fn: F) -> F:
        opts = _retry_opts() + (_breaker_opts() + _guard_opts() if breaker else [])
        for opt in reversed(opts):
            fn = opt(fn)
        return fn

    return decorate(f) if f is not None else decorate


def _delays(text: str) -> tuple[str, ...]:
    if text.strip().lower() == "none":
        return ()
    parts = tuple(p.strip() for p in text.split(","))
    if not text.strip() or any(not p for p in parts):
        raise UsageError(f"--retry-delays {text!r}: an empty delay (e.g. 5s,30s,2m or none)")
    return parts


def _retry(base: RetryPolicy, values: dict[str, Any]) -> RetryPolicy | None:
    """The policy the retry flags describe over `base`; None when none was given."""
    from onceq.core.retry import RetryPolicy, parse_duration

    name = values.pop("retry", None)
    immediate = values.pop("immediate_retries", None)
    delays_text = values.pop("retry_delays", None)
    if name is None and immediate is None and delays_text is None:
        return None
    policy = RetryPolicy.named(name) if name is not None else base
    changes: dict[str, Any] = {}
    if immediate is not None:
        changes["immediate"] = immediate
    if delays_text is not None:
        delays = _delays(delays_text)
        for d in delays:
            try:
                seconds = parse_duration(d, "retry delay")
            except UsageError:
                raise UsageError(
                    f"--retry-delays: {d!r}: not a duration (e.g. 5s, 2m, 500ms)"
                ) from None
            if seconds <= 0:
                raise UsageError(
                    f"--retry-delays: {d!r}: a delay must be more than 0"
                    " (an immediate retry is --immediate-retries)"
                )
        changes["delays"] = delays
    try:
        return dataclasses.replace(policy, **changes)
    except UsageError as exc:  # "retry: two delays are the same …"
        flag = "--retry-delays" if "delay" in str(exc) else "--immediate-retries"
        raise UsageError(f"{flag}: {str(exc).removeprefix('retry: ')}") from None


def _breaker(base: BreakerPolicy, values: dict[str, Any]) -> BreakerPolicy | None:
    """The breaker the flags describe over `base`; None when no breaker flag was given."""
    from onceq.core.retry import parse_duration

    enabled = values.pop("breaker", None)
    settings = {k: values.pop(k, None) for k in _BREAKER_SETTINGS}
    given = {k: v for k, v in settings.items() if v is not None}
    if enabled is None and not given:
        return None
    on = base.enabled if enabled is None else enabled
    if given and not on:
        # A setting for a breaker that is off would be silently ignored: refuse it.
        first = _flag(next(iter(given)))
        why = "--no-breaker" if enabled is False else "this flow has no call effect; add --breaker"
        raise UsageError(f"{first}: the breaker is off ({why})")
    changes: dict[str, Any] = {"enabled": on}
    for key, value in given.items():
        if key == "breaker_failures":
            changes["failures"] = value
            continue
        changes[_BREAKER_SETTINGS[key]] = parse_duration(value, _flag(key))  # names the flag
        if changes[_BREAKER_SETTINGS[key]] <= 0:
            raise UsageError(f"{_flag(key)}: {value!r}: must be more than 0")
    try:
        return dataclasses.replace(base, **changes)
    except UsageError as exc:  # "breaker: max probe must be at least the first probe delay"
        flag = "--breaker-max-probe" if "max probe" in str(exc) else "--breaker-probe"
        raise UsageError(f"{flag}: {str(exc).removeprefix('breaker: ')}") from None


def _guard(base: GuardPolicy, values: dict[str, Any]) -> GuardPolicy | None:
    """The guard the flags describe over `base`; None when no guard flag was given."""
    enabled = values.pop("guard", None)
    failures = values.pop("guard_failures", None)
    if enabled is None and failures is None:
        return None
    if enabled is False and failures is not None:
        raise UsageError("--guard-failures: the guard is off (--no-guard)")
    # --guard-failures alone turns it on (a preset's is off): a number is meant to count.
    changes: dict[str, Any] = {"enabled": enabled is not False}
    if failures is not None:
        changes["failures"] = failures
    return dataclasses.replace(base, **changes)


def retry_from_values(values: dict[str, Any]) -> RetryPolicy | None:
    """The retry policy the flags describe (over the default policy), None if no retry
    flag was given: `mq topology` declares this policy's tiers. Pops the retry keys."""
    from onceq.core.retry import RetryPolicy

    return _retry(RetryPolicy(), values)


def apply_retry(flow: Flow, values: dict[str, Any]) -> Flow:
    """`flow` with .retry/.breaker/.guard changed by whichever flags were given (a copy;
    the flow is unchanged when none was). Pops every retry, breaker and guard key from
    `values`; UsageError (exit 2) naming the flag for a bad value."""
    retry = _retry(flow.retry_policy(), values)
    breaker = _breaker(flow.breaker_policy(), values)
    guard = _guard(flow.guard_policy(), values)
    changes: dict[str, Any] = {}
    if guard is not None:
        changes["guard"] = guard
    if retry is not None:
        changes["retry"] = retry
    if breaker is not None:
        changes["breaker"] = breaker
    return dataclasses.replace(flow, **changes) if changes else flow
