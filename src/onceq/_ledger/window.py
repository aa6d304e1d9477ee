"""The retention window: the dedup horizon, and the floor no window may go under.

A `messages` row is what refuses a second copy of its message, so the window `prune`
keeps (`onceq._ledger.retention`) is how late a copy may come and still be refused. It
may not be shorter than the longest retry delay of the flows in question: a message
waiting in its last tier would lose the failures that count its attempts
(`check_window`, unless forced). `cutoff_of` is the window as the ledger writes times.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

from onceq._core.retry import RetryPolicy, delay_label
from onceq.errors import UsageError

__all__ = ["DEFAULT_LONGEST", "check_window", "cutoff_of", "window_floor"]

# The default policy's longest delay (10 min): the floor of a window when a flow's own
# policy is not known (a --db without a flow file).
DEFAULT_LONGEST = RetryPolicy().longest


def window_floor(
    flows: Sequence[str], policies: Mapping[str, RetryPolicy] | None = None
) -> tuple[float, str | None]:
    """(the longest retry delay of `flows`, the flow it is of): a flow without a policy
    in `policies` has the default's (10 min). No flow at all: the default's."""
    policies = policies or {}
    floor, which = DEFAULT_LONGEST, None
    for flow in flows:
        longest = policies[flow].longest if flow in policies else DEFAULT_LONGEST
        if which is None or longest > floor:
            floor, which = longest, flow
    return floor, which


def check_window(
    older_than: float,
    flows: Sequence[str],
    policies: Mapping[str, RetryPolicy] | None = None,
    *,
    force: bool = False,
) -> None:
    """UsageError when `older_than` is shorter than the longest retry delay of `flows`
    (their `policies`, else the default's 10 min) and not forced.

    A window shorter than that could prune the attempts of a message still waiting in
    its last tier (see the module's docstring).
    """
    floor, flow = window_floor(flows, policies)
    if older_than < floor and not force:
        whose = f", flow {flow}" if flow is not None else ""
        window = delay_label(older_than) if older_than else "0s"
        raise UsageError(
            f"--older-than {window}: shorter than the longest retry delay"
            f" ({delay_label(floor)}{whose}); a message waiting in that tier would lose its"
            " attempts; nothing pruned (--force to prune anyway)"
        )


def cutoff_of(older_than: float, now: datetime | None = None) -> str:
    """The cutoff as the ledger writes times (ISO 8601 UTC, microseconds): the text
    compares as the time does, on both kinds of ledger."""
    now = now or datetime.now(UTC)
    try:
        cut = now.astimezone(UTC) - timedelta(seconds=older_than)
    except OverflowError:  # a window longer than the calendar: everything is younger
        cut = datetime.min.replace(tzinfo=UTC)
    return cut.isoformat(timespec="microseconds")
