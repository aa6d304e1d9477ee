"""Dead letters as every kind of source shows them to the console: one shape, any queue.

A source type (`onceq._sources.registry.SourceType`) lists a flow's dead letters as
`DeadItem`s and replays or purges a selection of them through the same code as its
own commands (`mq dead replay|purge`, `dirq replay`): the ledger reset, the confirmed
copy, the audit row (`dead_ops`). The generic layers (the console) only see these
shapes, never a queue's own.

A selection is by `key` (what names one dead letter in its queue: the msg_id, or the
file name / ref of one that has none) or by reason; an action takes the dead letters
that match the selection *when it runs*, so a second click on an action already done
finds nothing left to do (a replayed letter is no longer dead), and replays nothing
twice.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["DeadAction", "DeadItem", "DeadSelection"]


@dataclass
class DeadItem:
    """One dead letter (a message in a dead-letter queue, a file in error/)."""

    key: str  # what selects it: its msg_id, else its file name / ref
    msg_id: str | None
    reason: str  # the ledger's (http-422, missing-field …); "unknown" when it has none
    detail: str | None
    attempts: int | None
    died_at: str | None  # ISO 8601, UTC
    size: int  # the body's bytes
    where: str  # the queue or folder it lies in
    body: bytes | None = field(default=None, repr=False)  # only when asked for
    # What the queue says of it besides the body, header values masked: x-death, the
    # content type, … (a file: its name and size).
    properties: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("body")
        return out


@dataclass(frozen=True)
class DeadSelection:
    """Which dead letters an action takes: these keys, or every one of a reason."""

    keys: tuple[str, ...] = ()
    reason: str | None = None

    def matches(self, item: DeadItem) -> bool:
        if self.keys and item.key not in self.keys:
            return False
        return self.reason is None or item.reason == self.reason

    def as_filter(self, via: str = "console") -> dict[str, Any]:
        """The selection as the audit row's filter (`dead_ops.filter`), with who asked."""
        out: dict[str, Any] = {"via": via}
        if self.keys:
            out["ids"] = list(self.keys)
        if self.reason is not None:
            out["reason"] = self.reason
        return out


@dataclass
class DeadAction:
    """What a replay or purge did: how many it took, which it left and why, its audit row."""

    action: str  # replay | purge
    matched: int = 0
    done: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (key, why)
    op: int | None = None  # the dead_ops row

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "matched": self.matched,
            "done": self.done,
            "skipped": [{"key": k, "why": why} for k, why in self.skipped],
            "op": self.op,
        }
