"""The rates of `status --watch`: a minute of snapshots, newest minus oldest."""

from __future__ import annotations

from typing import Any

from onceq._ops.status_watch import Rates


def doc(processed: int, dead: int, name: str = "a") -> dict[str, Any]:
    return {"flows": {name: {"ledger": {"processed": processed, "dead": dead}}}}


def test_one_snapshot_has_no_rate_then_the_difference_over_the_time() -> None:
    r = Rates(window=60)
    assert r.add(doc(10, 0), at=0.0)["a"] == {
        "processed_per_s": None,
        "dead_per_s": None,
        "over_s": None,
    }
    assert r.add(doc(30, 4), at=10.0)["a"] == {
        "processed_per_s": 2.0,
        "dead_per_s": 0.4,
        "over_s": 10.0,
    }


def test_only_the_last_minute_counts() -> None:
    r = Rates(window=60)
    r.add(doc(0, 0), at=0.0)  # a burst long ago
    r.add(doc(600, 0), at=10.0)
    for t in range(20, 200, 10):
        got = r.add(doc(600 + (t - 10), 0), at=float(t))["a"]
    # Over the last minute (and a refresh), 1 message a second: the burst is gone.
    assert got["processed_per_s"] == 1.0
    assert 60 <= got["over_s"] <= 70


def test_a_count_that_went_down_is_a_rate_of_zero() -> None:
    r = Rates()
    r.add(doc(5, 9), at=0.0)
    got = r.add(doc(6, 2), at=1.0)["a"]  # dead letters replayed meanwhile
    assert got["dead_per_s"] == 0.0 and got["processed_per_s"] == 1.0


def test_a_flow_whose_ledger_could_not_be_read_has_no_rate() -> None:
    r = Rates()
    r.add({"flows": {"a": {"ledger": None}}}, at=0.0)
    got = r.add({"flows": {"a": {"ledger": None}}}, at=1.0)
    assert got["a"]["processed_per_s"] is None
