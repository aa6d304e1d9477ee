"""`Entry`: one delivery's outcome on its way into the ledger.

The loop makes it (`Consumer._entry`), a ledger's group commit records it and may
change its verdict, the stats and the log lines read it once settled. It lives in
core, beside the loop, so the loop and the counters never import a ledger.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from onceq._core.retry import RetryPolicy
from onceq._core.transport import DEAD, REJECTED, Delivery, Kind, Settle

__all__ = ["Entry"]


@dataclass(eq=False)
class Entry:
    """One delivery's outcome on its way into the ledger.

    The loop fills kind/settle/reason; `commit` may turn a SUCCESS into a
    DUPLICATE (another process won the primary key), REJECTED (the database refused
    its row) or a failure of its SQL effect, and says so in `kind`, `settle` and
    `reason`. `max_attempts` is the loop's, for an SQL effect's failure to be decided
    like any other. `row` is its `messages` row, built once by `commit`.
    """

    delivery: Delivery
    kind: Kind
    settle: Settle
    reason: str = ""
    detail: str = ""
    attempt: int = 1
    fields: dict[str, Any] = field(default_factory=dict)
    recovered: bool = False  # the row already names this very copy: a crash after commit
    max_attempts: int = 1
    row: tuple[Any, ...] = field(default=(), repr=False)
    # The loop's retry policy, for an SQL effect's failure to be decided like any other
    # (None: `max_attempts` tries, no delays).
    policy: RetryPolicy | None = field(default=None, repr=False)

    def _state(self) -> tuple[Any, ...]:
        return (self.kind, self.settle, self.reason, self.detail, self.recovered, self.attempt)

    def _restore(self, state: tuple[Any, ...]) -> None:
        self.kind, self.settle, self.reason, self.detail, self.recovered, self.attempt = state

    def _refuse(self, detail: str) -> None:
        """The ledger cannot record this success: it becomes a dead letter, with why."""
        self.kind, self.settle, self.recovered = REJECTED, DEAD, False
        self.reason, self.detail = "ledger-refused", detail
