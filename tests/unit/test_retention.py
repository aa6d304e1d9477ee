"""Retention on both ledgers (onceq._ledger.retention): prune removes exactly the old rows, keeps
what must stay even when old (a retrying message's attempts, the replays that hide
failures, killed operations, the newest id), per flow, in batches that each commit;
dry-run changes nothing; a window shorter than the longest retry delay is refused;
stats' figures are the rows counted."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from onceq._core.retry import RetryPolicy
from onceq._core.transport import Settle
from onceq._ledger.retention import TABLE_NAMES, prune, stats
from onceq._ledger.target import open_ledger
from onceq.errors import UsageError
from retention_support import DAY, NOW, OLD, backdate, failed, fill, newest_rows_are_new, ok, rows

WINDOW = 30 * DAY  # the window every test prunes with; OLD rows are 40 days old


def test_prune_removes_exactly_the_old_rows_of_every_flow(ledger_target: str) -> None:
    gone = {"a": fill(ledger_target, "a"), "b": fill(ledger_target, "b")}
    newest_rows_are_new(ledger_target)
    with open_ledger(ledger_target, flow="a") as led:
        before = rows(led)
        removed = prune(led, WINDOW)
        after = rows(led)
        for t in TABLE_NAMES:
            want = gone["a"][t] | gone["b"][t]
            assert before[t] - after[t] == want, t
            assert after[t] <= before[t], t
            assert removed[t] == {"a": len(gone["a"][t]), "b": len(gone["b"][t]), "c": 0}, t
        # what stayed works as before: the retrying message kept its attempts, the
        # replayed one still has its old failure hidden, new messages are still refused
        assert led.failed_attempts("a-waiting") == 2
        assert led.failed_attempts("a-replayed") == 1
        assert led.processed_ref("a-new-1") == "a-new-1.json"
        assert led.processed_ref("a-old-1") is None
        led.commit([ok("a-new-1", "copy-2.json"), ok("a-old-1", "copy-2.json")])
        assert led.processed_ref("a-old-1") == "copy-2.json"  # outside the window: again
        assert led.processed_ref("a-new-1") == "a-new-1.json"  # inside: a duplicate
        assert prune(led, WINDOW) == {t: {"a": 0, "b": 0, "c": 0} for t in TABLE_NAMES}


def test_prune_of_one_flow_leaves_the_others_untouched(ledger_target: str) -> None:
    gone = fill(ledger_target, "a")
    fill(ledger_target, "b")
    with open_ledger(ledger_target, flow="b") as led:
        before = rows(led)
        removed = prune(led, WINDOW, flows=["a"])
        after = rows(led)
    for t in TABLE_NAMES:
        assert before[t] - after[t] == gone[t], t
        assert removed[t] == {"a": len(gone[t])}
    with pytest.raises(UsageError, match="not a flow name"):
        prune(led, WINDOW, flows=["no such/flow"])


def test_a_dry_run_counts_what_prune_removes_and_changes_nothing(ledger_target: str) -> None:
    fill(ledger_target, "a")
    fill(ledger_target, "b")
    with open_ledger(ledger_target, flow="a") as led:
        before = rows(led)
        counted = prune(led, WINDOW, dry_run=True)
        assert rows(led) == before
        assert prune(led, WINDOW) == counted
        assert sum(n for per in counted.values() for n in per.values()) > 10


def test_prune_works_in_batches_each_its_own_transaction(ledger_target: str) -> None:
    with open_ledger(ledger_target, flow="a") as led:
        led.commit([ok(f"m-{i:03}") for i in range(100)])
        backdate(led, "messages", "processed_at", "msg_id < ?", ("m-095",))
        seen: list[tuple[str, int, int]] = []

        def progress(table: str, flow: str, removed: int) -> None:
            # read through a connection of its own: each batch is committed when it is
            # reported, not held in one long transaction until the end
            with open_ledger(ledger_target, flow="a", create=False) as other:
                left = other._q1("SELECT count(*) FROM messages", ())[0]
            seen.append((table, removed, int(left)))

        removed = prune(led, WINDOW, batch=10, flows=["a"], progress=progress)
    assert removed["messages"] == {"a": 95}
    msgs = [s for s in seen if s[0] == "messages"]
    assert [s[1] for s in msgs] == [10, 20, 30, 40, 50, 60, 70, 80, 90, 95]
    assert [s[2] for s in msgs] == [100 - n for n in (10, 20, 30, 40, 50, 60, 70, 80, 90, 95)]


def test_a_window_shorter_than_the_longest_retry_delay_is_refused_unless_forced(
    ledger_target: str,
) -> None:
    with open_ledger(ledger_target, flow="a") as led:
        led.commit([ok("m-1")])
        backdate(
            led,
            "messages",
            "processed_at",
            "msg_id = ?",
            ("m-1",),
            (NOW - timedelta(minutes=20)).isoformat(timespec="microseconds"),
        )
        with pytest.raises(
            UsageError,
            match=r"--older-than 5m: shorter than the longest retry"
            r" delay \(10m, flow a\).*nothing pruned",
        ):
            prune(led, 300)  # the default policy's last tier is 10 min
        with pytest.raises(
            UsageError, match=r"shorter than the longest retry delay \(1h, flow a\)"
        ):
            prune(led, 1800, policies={"a": RetryPolicy(delays=(3600,))})
        assert led.processed_ref("m-1") == "m-1.json"
        assert prune(led, 900)["messages"] == {"a": 1}  # 15 min ≥ 10 min: allowed
        led.commit([ok("m-2")])
        backdate(
            led,
            "messages",
            "processed_at",
            "msg_id = ?",
            ("m-2",),
            (NOW - timedelta(minutes=2)).isoformat(timespec="microseconds"),
        )
        b_slow = {"a": RetryPolicy.none(), "b": RetryPolicy(delays=(7200,))}
        with pytest.raises(UsageError, match=r"\(2h, flow b\)"):
            prune(led, 60, policies=b_slow, flows=["a", "b"])
        assert led.processed_ref("m-2") == "m-2.json"
        # a flow that never retries has no floor; forced, any window goes
        assert prune(led, 60, policies=b_slow, flows=["a"])["messages"] == {"a": 1}
        led.commit([ok("m-3")])
        backdate(
            led,
            "messages",
            "processed_at",
            "msg_id = ?",
            ("m-3",),
            (NOW - timedelta(seconds=90)).isoformat(timespec="microseconds"),
        )
        assert prune(led, 60, force=True)["messages"] == {"a": 1}
    with pytest.raises(UsageError, match="batch"):
        prune(led, WINDOW, batch=0)


def test_the_newest_failure_stays_so_that_ids_are_never_reused(ledger_target: str) -> None:
    """Every failure is old; the message was replayed recently. Were every failure row
    removed, SQLite would give the next failure id 1, which the replay's reset_after
    hides: the message would fail without spending attempts."""
    with open_ledger(ledger_target, flow="a") as led:
        led.commit([failed("m-1", "1.json")])
        led.commit([failed("m-1", "2.json")])
        led.commit([failed("m-1", "3.json", Settle.DEAD)])
        led.record_replay("3.json")
        backdate(led, "failures", "at", "flow = ?", ("a",))
        assert led.failed_attempts("m-1") == 0
        removed = prune(led, WINDOW)
        assert removed["failures"] == {"a": 2} and removed["replays"] == {"a": 0}
        led.commit([failed("m-1", "4.json")])
        assert led.failed_attempts("m-1") == 1


def test_an_empty_ledger_prunes_nothing(ledger_target: str) -> None:
    with open_ledger(ledger_target, flow="a") as led:
        assert prune(led, WINDOW) == {t: {} for t in TABLE_NAMES}
        assert prune(led, WINDOW, flows=["a"]) == {t: {"a": 0} for t in TABLE_NAMES}
        s = stats(led)
    assert all(s["tables"][t] == {"rows": 0, "oldest": None, "flows": {}} for t in TABLE_NAMES)


def test_stats_figures_are_the_rows_counted(ledger_target: str) -> None:
    fill(ledger_target, "a")
    fill(ledger_target, "b")
    with open_ledger(ledger_target, flow="b") as led:
        s = stats(led)
        for t in TABLE_NAMES:
            col = (
                "started_at"
                if t == "dead_ops"
                else {"messages": "processed_at", "duplicates": "seen_at"}.get(t, "at")
            )
            total = led._q1(f"SELECT count(*) FROM {t}", ())[0]
            assert s["tables"][t]["rows"] == total > 0, t
            for flow in ("a", "b"):
                n, oldest = led._q1(f"SELECT count(*), min({col}) FROM {t} WHERE flow = ?", (flow,))
                got = s["tables"][t]["flows"][flow]
                assert got["rows"] == n, (t, flow)
                assert datetime.fromisoformat(got["oldest"]) == _as_time(oldest), (t, flow)
        assert s["tables"]["messages"]["oldest"] == min(
            f["oldest"] for f in s["tables"]["messages"]["flows"].values()
        )
        assert datetime.fromisoformat(s["tables"]["dead_ops"]["oldest"]) == _as_time(OLD)
        assert s["size_bytes"] == sum(s["size"].values()) > 0
        assert s["kind"] == getattr(led, "kind", "sqlite")


def _as_time(v: Any) -> datetime:
    return v if isinstance(v, datetime) else datetime.fromisoformat(v)
