"""The settle table, cell by cell (docs/architecture.md: the settle table)."""

from __future__ import annotations

import pytest

from onceq._core.transport import Kind, Settle, decide


@pytest.mark.parametrize(
    ("kind", "redelivered", "attempt", "expected"),
    [
        (Kind.SUCCESS, False, 1, Settle.ACK),
        (Kind.SUCCESS, True, 2, Settle.ACK),
        (Kind.DUPLICATE, False, 1, Settle.ACK),
        (Kind.DUPLICATE, True, 1, Settle.ACK),
        (Kind.REJECTED, False, 1, Settle.DEAD),
        (Kind.REJECTED, True, 1, Settle.DEAD),
        (Kind.TRANSIENT, False, 1, Settle.REQUEUE),
        # failed once before (the ledger counted it): dead, with or without the flag
        (Kind.TRANSIENT, True, 2, Settle.DEAD),
        (Kind.TRANSIENT, False, 2, Settle.DEAD),
        # flagged redelivered but never tried (returned by a stop or a dropped
        # connection): its first real failure still gets its one retry
        (Kind.TRANSIENT, True, 1, Settle.REQUEUE),
    ],
)
def test_settle_table(kind: Kind, redelivered: bool, attempt: int, expected: Settle) -> None:
    assert decide(kind, redelivered, attempt) is expected


def test_a_queue_without_redelivery_quarantines_transients_at_once() -> None:
    assert decide(Kind.TRANSIENT, False, 1, max_attempts=1) is Settle.DEAD


def test_more_attempts_can_be_allowed_without_touching_the_loop() -> None:
    assert decide(Kind.TRANSIENT, False, 2, max_attempts=3) is Settle.REQUEUE
    assert decide(Kind.TRANSIENT, False, 3, max_attempts=3) is Settle.DEAD
