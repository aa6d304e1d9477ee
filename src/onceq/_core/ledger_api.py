"""What the consume loop needs of a ledger: `LedgerApi`, a typed protocol.

The loop (`onceq._core.consumer`), its holds (`onceq._core.holds`) and its leases
(`onceq._core.inflight`) depend on this and on nothing of `onceq._ledger`: both ledgers
(`onceq._ledger.sqlite.Ledger`, `onceq._ledger.pg.ledger.PgLedger`) meet it, and so
can a test's or a user's. Every method is called as it is: no capability probes, so
a ledger without a lost connection to wait out says so by answering (`ping` True,
`interrupt` a no-op), not by leaving a method out.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from onceq._core.entry import Entry
from onceq._core.inflight import InflightGuard

__all__ = ["LedgerApi"]


class LedgerApi(Protocol):
    """The ledger of one flow, as the consume loop uses it."""

    @property
    def flow(self) -> str:
        """The flow whose rows this ledger reads and writes (names the breaker)."""

    @property
    def path(self) -> Path | str:
        """Where it lives, as messages name it (a URL's password masked)."""

    async def aprocessed_ref(self, msg_id: str) -> str | None:
        """The ref that took effect for msg_id, '' when it has none, None when unseen:
        the duplicate check, asked on the event loop (the ids of one tick read together:
        one read on SQLite, one round trip on PostgreSQL)."""

    def failed_attempts(self, msg_id: str) -> int:
        """The failures recorded for msg_id since its last replay."""

    def commit(self, entries: Iterable[Entry]) -> None:
        """Record a group of outcomes in one durable transaction (from a worker thread)."""

    def ping(self) -> bool:
        """Does the ledger answer now? (Polled while a read found it away.)"""

    def interrupt(self) -> None:
        """Make a commit waiting for a lost database give up (a stop)."""

    def inflight_guard(self) -> InflightGuard | None:
        """A new cross-process in-flight guard for this ledger's consumers, or None."""
