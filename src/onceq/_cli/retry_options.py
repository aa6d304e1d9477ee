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
flags changed no existing run. Their values are flow keys (`retry.delays`, …: the table
in onceq._cli.flow_flags) read by the flow file's builder (onceq._flows.build), which
names the flag in the one-line refusal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from onceq._cli.flow_flags import over_preset, retry_policy

if TYPE_CHECKING:
    from onceq._core.retry import RetryPolicy
    from onceq._flows.flow import Flow

F = TypeVar("F", bound=Callable[..., Any])

RETRY_KEYS = ("retry", "immediate_retries", "retry_delays")
BREAKER_KEYS = ("breaker", "breaker_failures", "breaker_probe", "breaker_max_probe")
GUARD_KEYS = ("guard", "guard_failures")


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


def _pop(values: dict[str, Any]) -> dict[str, Any]:
    return {k: values.pop(k) for k in (*RETRY_KEYS, *BREAKER_KEYS, *GUARD_KEYS) if k in values}


def retry_from_values(values: dict[str, Any]) -> RetryPolicy | None:
    """The retry policy the flags describe (over the default policy), None if no retry
    flag was given: `mq topology` declares this policy's tiers. Pops the retry keys."""
    return retry_policy(_pop(values))


def apply_retry(flow: Flow, values: dict[str, Any]) -> Flow:
    """`flow` with .retry/.breaker/.guard changed by whichever flags were given (a copy;
    the flow is unchanged when none was). Pops every retry, breaker and guard key from
    `values`; UsageError (exit 2) naming the flag for a bad value."""
    return over_preset(flow, _pop(values))
