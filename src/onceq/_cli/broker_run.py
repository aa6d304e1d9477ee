"""A broker consumer's run as its command reports it: `mq consume` and `nats consume`.

Both run one flow until stopped (or drained, with --until-empty) and end alike: the
counts as JSON or a summary line, then the run's end mapped to an exit code. What
differs is said by `Where`: the name the user knows the source by, and where a copy
left unsettled goes (RabbitMQ returns it to the queue; NATS redelivers it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from onceq._cli.output import emit_json, note_new_ledger, print_run_summary
from onceq._cli.progress import live_progress
from onceq._core.hooks import RunHooks
from onceq._core.stop import Stop
from onceq._flows.batch import run_report
from onceq._flows.run_end import run_error
from onceq._ledger.target import Target, describe

__all__ = ["Where", "consume_and_report"]


@dataclass(frozen=True)
class Where:
    """The source as a line names it, and the fate of a copy a stop left unsettled."""

    name: str  # "claim.in", "INVOICES/worker"
    unsettled: str  # the summary's "N unsettled (…)": "back to claim.in", "redelivered"
    in_flight: str  # after a second signal: "return to claim.in", "are redelivered by …"


def consume_and_report(
    flow: Any,
    ledger: Target,
    where: Where,
    *,
    until_empty: bool,
    max_seconds: float | None,
    telemetry: Any,
    as_json: bool,
) -> None:
    """Run `flow` into `ledger`, print its outcome; raise the error its end maps to."""
    hooks = RunHooks()
    hooks.ledger_created.append(note_new_ledger)
    with live_progress(where.name, "dead", hooks):
        report = run_report(
            [flow],
            ledger,
            until_empty=until_empty,
            max_seconds=max_seconds,
            telemetry=telemetry,
            hooks=hooks,
            # A service: it takes both signals whatever it inherited, and a second one
            # cuts the grace short (exit 130/143) instead of ending the process.
            stop=Stop(second="abort", respect_ignored=False),
        )
    name = flow.name
    result = {
        **report.stats[name].as_dict(),
        "unsettled": report.unsettled.get(name, 0),  # deliveries a stop left unsettled
        "db": describe(ledger),  # a URL without its password
        "aborted": report.aborted,
    }
    if until_empty:
        result["drained"] = report.drained[name]
    if as_json:
        emit_json(result)
    else:
        left = result["unsettled"]
        tail = f", {left} unsettled ({where.unsettled})" if left else ""
        if result.get("drained"):
            tail += f"; {where.name} drained"
        print_run_summary(report.stats[name], tail=f"{tail}; ledger {describe(ledger)}")
    # A service that is stopped ends 0 whatever it saw; a drained batch whose every
    # message failed ends 11 (not the claims preset: the exercise's rule).
    error = run_error(
        report,
        [flow],
        batch=until_empty,
        where=lambda _f: where.name,
        unfinished=lambda sig, aborted: _unfinished(sig, aborted, max_seconds, where),
    )
    if error is not None:
        raise error


def _unfinished(
    signal_name: str | None, aborted: bool, max_seconds: float | None, where: Where
) -> str:
    """The one line of a run that did not finish (128 + the signal, or 1 for the deadline)."""
    if aborted:  # an interrupted command: the run did not finish its in-flight copies
        return f"interrupted by a second signal; in-flight messages {where.in_flight}"
    if signal_name is not None:
        return f"stopped by {signal_name} before {where.name} was drained; the rest waits there"
    within = f" within --max-seconds {max_seconds:g}" if max_seconds is not None else ""
    return f"{where.name} not drained{within}; the rest waits there"
