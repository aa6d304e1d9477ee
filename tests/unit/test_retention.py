"""Retention on both ledgers (onceq.retention): prune removes exactly the old rows, keeps
what must stay even when old (a retrying message's attempts, the replays that hide
failures, killed operations, the newest id), per flow, in batches that each commit;
dry-run changes nothing; a window shorter than the longest retry delay is refused;
stats' figures are the rows counted."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from onceq.errors import UsageError
from onceq.ledger import Entry
from onceq.ledger_target import open_ledger
from onceq.retention import TABLE_NAMES, prune, stats
from onceq.retry import RetryPolicy
from onceq.transport import Delivery, Kind, Settle

DAY = 86_400.0
WINDOW = 30 * DAY
NOW = datetime.now(UTC)
OLD = (NOW - timedelta(days=40)).isoformat(timespec="microseconds")
OLDER = (NOW - timedelta(days=50)).isoformat(timespec="microseconds")


def ok(msg_id: str, ref: str = "") -> Entry:
    return Entry(Delivery(b"{}", ref or f"{msg_id}.json", msg_id), Kind.SUCCESS, Settle.ACK)


def failed(msg_id: str | None, ref: str, settle: Settle = Settle.REQUEUE) -> Entry:
    return Entry(Delivery(b"{}", ref, msg_id), Kind.TRANSIENT, settle, "http-503", "busy")


def backdate(ledger: Any, table: str, col: str, where: str, args: tuple[Any, ...], when: str = OLD):
    with ledger._transaction() as conn:
        conn.execute(f"UPDATE {table} SET {col} = ? WHERE {where}", (when, *args))


def rows(ledger: Any) -> dict[str, set[tuple[Any, ...]]]:
    """Every ledger row, by what identifies it (ids for the id tables)."""
    keys = {
        "messages": "flow, msg_id",
        "duplicates": "flow, msg_id, ref",
        "failures": "flow, id, msg_id",
        "replays": "flow, id, msg_id",
        "dead_ops": "flow, id",
    }
    return {t: set(ledger._rows(f"SELECT {k} FROM {t}")[1]) for t, k in keys.items()}


@pytest.fixture
def ledger(ledger_target: str) -> Iterator[Any]:
    with open_ledger(ledger_target, flow="a") as led:
        yield led


def fill(target: str, flow: str) -> dict[str, Any]:
    """One flow's rows, old and new, with every case of what must stay; the ids to expect."""
    with open_ledger(target, flow=flow) as led:
        led.commit([ok(f"{flow}-old-{i}") for i in range(5)])
        led.commit([ok(f"{flow}-new-{i}") for i in range(3)])
        backdate(led, "messages", "processed_at", "flow = ? AND msg_id LIKE ?", (flow, "%-old-%"))
        # duplicates: a copy of an old message seen long ago, one of a new one seen now
        led.commit([ok(f"{flow}-old-0", "copy-old.json"), ok(f"{flow}-new-0", "copy-new.json")])
        backdate(led, "duplicates", "seen_at", "flow = ? AND ref = ?", (flow, "copy-old.json"))
        # done: failed twice long ago, then succeeded (its failures may all go)
        led.commit([failed(f"{flow}-done", "d1.json")])
        led.commit([failed(f"{flow}-done", "d2.json")])
        # waiting: failed long ago and again now (in a retry tier): both stay
        led.commit([failed(f"{flow}-waiting", "w1.json")])
        led.commit([failed(f"{flow}-waiting", "w2.json")])
        # never parsed, long ago: goes
        led.commit([failed(None, "junk.json", Settle.DEAD)])
        # replayed: dead long ago, replayed long ago, then failed once more now: the
        # replay hides the old failure, which stays (its message has a new one), so the
        # replay stays too (else the old failure would count again)
        led.commit([failed(f"{flow}-replayed", "r1.json", Settle.DEAD)])
        led.record_replay("r1.json")
        led.commit([failed(f"{flow}-replayed", "r2.json")])
        # dead long ago and replayed long ago, then nothing: replay and failure go
        led.commit([failed(f"{flow}-gone", "g1.json", Settle.DEAD)])
        led.record_replay("g1.json")
        backdate(
            led,
            "failures",
            "at",
            "flow = ? AND ref IN (?,?,?,?,?,?)",
            (flow, "d1.json", "d2.json", "w1.json", "junk.json", "r1.json", "g1.json"),
        )
        backdate(led, "replays", "at", "flow = ?", (flow,))
        # dead-letter operations: finished long ago (goes), killed long ago (stays: its
        # finished_at is NULL), finished now (stays)
        finished_old = led.start_op("dirq", "replay", {}, "q")
        led.finish_op(finished_old)
        killed = led.start_op("dirq", "purge", {}, "q")
        finished_new = led.start_op("dirq", "replay", {}, "q")
        led.finish_op(finished_new)
        backdate(
            led, "dead_ops", "started_at", "flow = ? AND id IN (?,?)", (flow, finished_old, killed)
        )
        backdate(led, "dead_ops", "finished_at", "flow = ? AND id = ?", (flow, finished_old))
        fid = {
            ref: r[0]
            for ref in ("d1.json", "d2.json", "junk.json", "g1.json")
            for r in [led._q1("SELECT id FROM failures WHERE flow = ? AND ref = ?", (flow, ref))]
        }
        rid = {
            r[1]: r[0]
            for r in led._rows("SELECT id, msg_id FROM replays WHERE flow = ?", (flow,))[1]
        }
        assert led.failed_attempts(f"{flow}-waiting") == 2
        assert led.failed_attempts(f"{flow}-replayed") == 1
        return {
            "messages": {(flow, f"{flow}-old-{i}") for i in range(5)},
            "duplicates": {(flow, f"{flow}-old-0", "copy-old.json")},
            "failures": {
                (flow, fid["d1.json"], f"{flow}-done"),
                (flow, fid["d2.json"], f"{flow}-done"),
                (flow, fid["junk.json"], None),
                (flow, fid["g1.json"], f"{flow}-gone"),
            },
            "replays": {(flow, rid[f"{flow}-gone"], f"{flow}-gone")},
            "dead_ops": {(flow, finished_old)},
        }


def newest_rows_are_new(target: str) -> None:
    """A failure and a replay written after the fills (the newest row of an id table
    stays even when old: the test of that is its own)."""
    with open_ledger(target, flow="c") as led:
        led.commit([failed("c-1", "c.json")])
        led.record_replay("c.json")


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
