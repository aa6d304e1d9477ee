"""What a consume loop tells whoever watches it: one list of callbacks per event.

    consumer.hooks.settled.append(progress.settled)     # each settled group
    consumer.hooks.call_ended.append(durations.observe)  # each call's seconds
    consumer.hooks.state.append(heartbeat.poke)          # "stopping", "misconfigured"

The loop emits; metrics, the heartbeat, the progress line and the logs subscribe
(onceq._ops.telemetry, onceq._cli.progress). Nothing is threaded through the layers as
a parameter, and nobody patches the consumer from outside.

Why it costs nothing when no one listens: an event is a plain list. `settled` is
emitted once per group (after its settle), `state` only on a change; the one
per-message event, `call_ended`, is read once per call as the truth of an empty
list, exactly the check the old `effect_timer is not None` was, and only then does
the loop read the clock. No callback is awaited: a subscriber that needs to do work
off the loop starts it itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Hooks", "RunHooks"]


class Hooks:
    """The events of one consumer; each a list its watchers append their callback to.

    Callbacks run on the loop's thread, in the committer (settled) or the handler
    task (call_ended), and must not block. One that raises fails the committer as
    `on_settled` always did (a user's callback is part of their run); onceq's own
    watchers (the log lines) guard themselves.
    """

    __slots__ = ("call_ended", "settled", "state")

    def __init__(self) -> None:
        self.settled: list[Callable[[Sequence[Any]], None]] = []
        self.call_ended: list[Callable[[float], None]] = []
        self.state: list[Callable[[str], None]] = []

    def emit_settled(self, group: Sequence[Any]) -> None:
        for fn in self.settled:
            fn(group)

    def emit_state(self, what: str) -> None:
        for fn in self.state:
            fn(what)


class RunHooks:
    """The events of a run (onceq._flows.runner), for the command that started it.

    `consumer(flow name, its Hooks)`: a flow's consumer is about to run (a progress
    line subscribes to its groups); `ledger_created(target)`: this run made the
    ledger's tables (it has seen no message: the command says so).
    """

    __slots__ = ("consumer", "ledger_created")

    def __init__(self) -> None:
        self.consumer: list[Callable[[str, Hooks], None]] = []
        self.ledger_created: list[Callable[[Any], None]] = []
