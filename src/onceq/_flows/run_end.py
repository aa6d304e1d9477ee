"""What a run did (`RunReport`) and how it ends (`run_error`): one rule for every way in.

The runner (onceq._flows.runner) never decides an exit code: it stops, settles and
reports. `run_error` turns a report into the one error a run ends with (None: it
ended well), in one order for every command:

1. a flow's misconfiguration guard tripped: `Misconfigured` (10), naming it;
2. a batch that a signal or the deadline stopped before it finished: `Stopped`
   (128 + the signal: 130/143; 1 for the deadline), in the command's own words;
3. a second signal cut a service's grace short (`mq consume`): `Stopped` (130/143);
4. a finished batch whose flow received messages and every one failed: `AllFailed`
   (11), except under the exercise presets' rule (they end 0).

The CLI prints the summary, then raises it (one line, its exit code: onceq._cli);
the Python API (`onceq.run`) raises 1 and 4 and returns the counts otherwise.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from onceq._core.misconfig import run_error as flow_error
from onceq._core.misconfig import stopped_error
from onceq._core.stats import Stats
from onceq._ledger.target import Target, describe
from onceq.errors import AllFailed, OnceqError

if TYPE_CHECKING:
    from onceq._flows.flow import Flow

__all__ = ["RunReport", "Stopped", "run_error"]


class Stopped(OnceqError):
    """A run a signal or its deadline ended before it finished; `stats`: what it settled."""

    def __init__(self, message: str, exit_code: int, stats: Any = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.stats = stats


@dataclass
class RunReport:
    """What a run of one or several flows did; `finished` says a batch emptied every source."""

    ledger: Target  # a path or a postgresql:// URL (shown by `describe`: no password)
    stats: dict[str, Stats] = field(default_factory=dict)
    drained: dict[str, bool] = field(default_factory=dict)  # rabbitmq flows
    unsettled: dict[str, int] = field(default_factory=dict)  # rabbitmq flows
    signal: int | None = None  # the first stop signal
    deadline: bool = False  # max_seconds stopped it
    aborted: bool = False  # a second signal cut the grace short (a service's stop)
    abort_signal: int | None = None  # that signal
    created: bool = False  # this run made the ledger's tables (it had seen nothing)

    @property
    def finished(self) -> bool:
        return self.signal is None and not self.deadline and all(self.drained.values())

    def add(self, name: str, stats: Stats, extra: dict[str, Any]) -> None:
        """One consumer's end: its counts summed into its flow's, and what its source adds."""
        total = self.stats.setdefault(name, Stats(dead_word=stats.dead_word))
        total.merge(stats.as_dict())
        if "drained" in extra:
            self.drained[name] = extra["drained"]
        if "unsettled" in extra:
            self.unsettled[name] = self.unsettled.get(name, 0) + extra["unsettled"]
        self.aborted = self.aborted or bool(extra.get("aborted"))

    def as_dict(self) -> dict[str, Any]:
        flows = {}
        for name, stats in self.stats.items():
            d = stats.as_dict()
            if name in self.drained:
                d["drained"] = self.drained[name]
                d["unsettled"] = self.unsettled[name]
            flows[name] = d
        return {"ledger": describe(self.ledger), "flows": flows, "finished": self.finished}


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def run_error(
    report: RunReport,
    flows: Sequence[Flow],
    *,
    batch: bool,
    where: Callable[[Flow], str],
    unfinished: Callable[[str | None, bool], str] | None = None,
) -> OnceqError | None:
    """The error this run ends with, or None (see the module).

    `where(flow)` names a flow in a line (its queue folder, its queue, `flow NAME`);
    `unfinished(signal name or None: the deadline, aborted)` words a run that did not
    finish: a batch stopped first, or a service whose grace a second signal cut short
    (`aborted`). None: neither is an error (the Python API returns the counts).
    """
    for f in flows:
        stats = report.stats.get(f.name)
        if stats is not None and stats.misconfigured:
            return stopped_error(stats, where(f))
    if unfinished is not None:
        one = report.stats.get(flows[0].name) if len(flows) == 1 else None
        if batch and not report.finished:
            if report.signal is None:
                return Stopped(unfinished(None, False), 1, one)
            return Stopped(unfinished(signal_name(report.signal), False), 128 + report.signal, one)
        if report.aborted:
            signum = report.abort_signal or signal.SIGINT
            return Stopped(unfinished(signal_name(signum), True), 128 + signum, one)
    if not (batch and report.finished):
        return None
    lines = []
    for f in flows:
        stats = report.stats.get(f.name)
        if stats is not None:
            error = flow_error(f.guard_policy(), stats, batch=True, where=where(f))
            if error is not None:
                lines.append(str(error))
    if not lines:
        return None
    return AllFailed("; ".join(lines), report.stats)
