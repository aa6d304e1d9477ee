"""The misconfiguration guard's decision (onceq._core.misconfig), pure, and the loop obeying it.

The first N verdicts all REJECTED for the same reason trip it; one success, duplicate,
transient failure or other reason among them disarms it for the run; HELD is no
verdict. The loop then takes nothing more: copies not yet decided go back untried,
calls under way are recorded as they end (at most N + the calls in flight are lost).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
from pathlib import Path
from typing import Any

import pytest

import onceq
from onceq._core.consumer import Consumer, Outcome, no_effect
from onceq._core.message import MessageSpec
from onceq._core.misconfig import (
    DEFAULT_FAILURES,
    GuardPolicy,
    MisconfigGuard,
    SharedTally,
    run_error,
    top_level_keys,
)
from onceq._core.stats import Stats
from onceq._core.transport import Delivery, Kind
from onceq._ledger.sqlite import Ledger
from onceq._sources.memory import MemoryTransport
from onceq.errors import AllFailed, Misconfigured, UsageError

R, S, D, T, H = Kind.REJECTED, Kind.SUCCESS, Kind.DUPLICATE, Kind.TRANSIENT, Kind.HELD


def guard(n: int = 3, **kw: Any) -> MisconfigGuard:
    return MisconfigGuard(GuardPolicy(failures=n), **kw)


def feed_all(g: MisconfigGuard, verdicts: list[tuple[Kind, str]]) -> list[bool]:
    return [
        g.feed(kind, reason, "invoice_id" if reason == "missing-field" else "")
        for kind, reason in verdicts
    ]


# --- the decision ----------------------------------------------------------------------


def test_the_nth_same_permanent_failure_trips_it_and_not_one_before() -> None:
    g = guard(3)
    assert feed_all(g, [(R, "http-404")] * 3) == [False, False, True]
    assert g.tripped and g.stopped and g.count == 3
    assert g.feed(R, "http-404") is False  # tripped once: later verdicts change nothing


@pytest.mark.parametrize("first", [(S, ""), (D, ""), (T, "http-503"), (R, "parse")])
def test_a_success_duplicate_transient_or_other_reason_among_the_first_disarms_it(
    first: tuple[Kind, str],
) -> None:
    for at in range(3):  # first, in the middle, last of the first N
        g = guard(3)
        verdicts = [(R, "http-404")] * 3
        verdicts.insert(at, first)
        assert not any(feed_all(g, verdicts + [(R, "http-404")] * 50))
        assert g.disarmed and not g.tripped


def test_held_is_not_a_verdict() -> None:
    g = guard(2)
    assert feed_all(g, [(H, "breaker-open"), (R, "http-401"), (H, ""), (R, "http-401")]) == [
        False,
        False,
        False,
        True,
    ]


def test_missing_field_is_the_same_reason_only_while_one_field_is_missing_from_all() -> None:
    g = guard(3)
    assert not g.feed(R, "missing-field", "invoice_id,customer")
    assert not g.feed(R, "missing-field", "invoice_id")
    assert g.feed(R, "missing-field", "total,invoice_id")
    assert g.missing == {"invoice_id"}
    g = guard(3)
    g.feed(R, "missing-field", "a")
    assert not g.feed(R, "missing-field", "b") and g.disarmed


def test_off_never_trips_and_one_trips_at_the_first() -> None:
    off = MisconfigGuard(GuardPolicy.off())
    assert not any(feed_all(off, [(R, "http-404")] * 1000))
    assert guard(1).feed(R, "http-404")
    assert GuardPolicy().failures == DEFAULT_FAILURES == 10 and GuardPolicy().enabled
    rule = GuardPolicy.exercise_rule()
    assert not rule.enabled and rule.exercise


@pytest.mark.parametrize("bad", [0, -1, 100_001, True, 2.5, "10"])
def test_a_policy_with_a_wrong_threshold_is_refused(bad: Any) -> None:
    with pytest.raises(UsageError, match="guard: failures"):
        GuardPolicy(failures=bad)


def test_the_missing_field_hint_names_the_field_and_the_keys_never_a_value() -> None:
    g = guard(2, id_field="invoice_id")
    body = json.dumps({"invoiceId": "INV-1", "token": "s3cr3t-value", "total": 12}).encode()
    g.feed(R, "missing-field", "invoice_id", body)
    g.feed(R, "missing-field", "invoice_id", json.dumps({"customer": "ACME"}).encode())
    hint = g.hint()
    assert "no message has the id field invoice_id" in hint, hint
    assert "the fields they have: customer, invoiceId, token, total" in hint, hint
    assert "s3cr3t" not in hint and "INV-1" not in hint and "ACME" not in hint
    assert "\n" not in hint


def test_a_key_with_a_control_character_or_a_long_name_stays_one_short_line() -> None:
    g = guard(1, id_field="id")
    g.feed(R, "missing-field", "id", json.dumps({"a\nb": 1, "k" * 500: 2}).encode())
    hint = g.hint()
    assert "\n" not in hint and "a\\nb" in hint and "k" * 500 not in hint


def test_top_level_keys_of_anything_that_is_not_an_object_are_none() -> None:
    assert top_level_keys(b'{"a": {"b": 1}, "c": 2}') == ("a", "c")
    for body in (b"", b"[1]", b"not json", b"\xff", None):
        assert top_level_keys(body) == ()


def test_the_http_hints_name_the_url_without_its_password() -> None:
    g = guard(1, url="http://bob:pa55word@127.0.0.1:9300/wrong-path")
    g.feed(R, "http-404")
    assert "http://bob:***@127.0.0.1:9300/wrong-path answers 404" in g.hint()
    assert "pa55word" not in g.hint()
    for status in ("401", "403"):
        g = guard(1, url="http://127.0.0.1:9/x")
        g.feed(R, f"http-{status}")
        assert f"refuses the credentials ({status})" in g.hint(), g.hint()


def test_a_shared_tally_counts_the_first_n_of_every_consumer_together() -> None:
    tally = SharedTally(mp.get_context("fork"))
    policy = GuardPolicy(failures=4)
    a, b = MisconfigGuard(policy, tally=tally), MisconfigGuard(policy, tally=tally)
    assert [a.feed(R, "http-404"), b.feed(R, "http-404"), a.feed(R, "http-404")] == [False] * 3
    assert b.feed(R, "http-404") and not a.tripped
    assert a.stopped  # it learns of the other's trip at its next look
    assert a.hint() == b.hint() and "404" in a.hint()
    tally = SharedTally(mp.get_context("fork"))
    a, b = MisconfigGuard(policy, tally=tally), MisconfigGuard(policy, tally=tally)
    a.feed(R, "http-404")
    b.feed(S)  # a success in another consumer disarms the run's guard
    assert not any(a.feed(R, "http-404") for _ in range(10)) and a.disarmed


# --- how a run ends ----------------------------------------------------------------------


def _stats(**counts: int) -> Stats:
    s = Stats(dead_word="quarantined")
    for k, v in counts.items():
        setattr(s, k, v)
    if s.dead:
        s.reasons["missing-field"] = s.dead
    return s


def test_run_error_is_10_when_the_guard_stopped_11_when_a_batch_all_failed() -> None:
    tripped = _stats(received=10, dead=10)
    tripped.misconfigured = "misconfigured? x"
    error = run_error(GuardPolicy(), tripped, batch=False, where="q")
    assert isinstance(error, Misconfigured) and error.exit_code == 10 and error.stats is tripped
    assert str(error).startswith("q: misconfigured? x; stopped with 10 quarantined")
    failed = _stats(received=3, dead=3)
    error = run_error(GuardPolicy.off(), failed, batch=True, where="q")
    assert isinstance(error, AllFailed) and error.exit_code == 11
    assert str(error) == "q: every message failed: 3 quarantined (missing-field 3)"
    assert run_error(GuardPolicy(), failed, batch=False, where="q") is None  # a service
    assert run_error(GuardPolicy.exercise_rule(), failed, batch=True, where="q") is None
    mixed = _stats(received=3, processed=1, dead=2)
    assert run_error(GuardPolicy(), mixed, batch=True, where="q") is None
    assert run_error(GuardPolicy(), _stats(), batch=True, where="q") is None  # nothing came


# --- the loop obeys it ---------------------------------------------------------------------


def _queue(n: int, body: bytes) -> MemoryTransport:
    return MemoryTransport(Delivery(body=body, ref=f"m{i}") for i in range(n))


SPEC = MessageSpec(id_field="invoice_id")
INVOICE = json.dumps({"invoiceId": "INV-1", "total": 1}).encode()


def test_the_loop_stops_after_n_and_gives_the_rest_back_untouched(tmp_path: Path) -> None:
    """No call (the ledger row is the effect): exactly N dead, not one more taken."""
    t = _queue(100, INVOICE)
    with Ledger(tmp_path / "l.db") as ledger:
        c = Consumer(t, ledger, SPEC.decode, no_effect, guard=guard(10, id_field="invoice_id"))
        stats = asyncio.run(c.run())
        assert ledger.counts()["processed"] == 0
    assert len(t.dead) == 10 and stats.dead == 10
    assert len(t.queue) == 90 and not t.acked and not t.requeued
    assert "no message has the id field invoice_id" in stats.misconfigured
    assert stats.received == 10 and not t.released  # nothing taken after the trip


class NotFound404:
    """A partner whose every call answers 404, slowly, counting the calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, d: Delivery, fields: dict[str, Any]) -> Outcome:
        self.calls += 1
        await asyncio.sleep(0.01)
        return Outcome(Kind.REJECTED, "http-404", "not found")


def test_calls_under_way_end_as_they_end_and_the_rest_is_released(tmp_path: Path) -> None:
    """With 5 in flight, at most N + 4 are dead; nothing is called after the trip."""
    spec = MessageSpec(id_field="invoiceId")
    t = MemoryTransport(
        Delivery(body=json.dumps({"invoiceId": f"I{i}"}).encode(), ref=f"m{i}") for i in range(200)
    )
    partner = NotFound404()
    with Ledger(tmp_path / "l.db") as ledger:
        c = Consumer(t, ledger, spec.decode, partner, max_in_flight=5, guard=guard(10))
        stats = asyncio.run(c.run())
    assert 10 <= len(t.dead) <= 10 + 4 and partner.calls == len(t.dead)
    assert len(t.dead) + len(t.queue) == 200 and not t.requeued
    assert "answers 404" in stats.misconfigured


def test_one_success_among_the_first_and_every_bad_message_is_dead_as_before(
    tmp_path: Path,
) -> None:
    docs = [{"invoiceId": "good"}] + [{"other": i} for i in range(30)]
    t = MemoryTransport(
        Delivery(body=json.dumps(d).encode(), ref=f"m{i}") for i, d in enumerate(docs)
    )
    with Ledger(tmp_path / "l.db") as ledger:
        c = Consumer(t, ledger, MessageSpec(id_field="invoiceId").decode, guard=guard(10))
        stats = asyncio.run(c.run())
    assert (stats.processed, stats.dead, stats.misconfigured) == (1, 30, "")


# --- through onceq.run (the Python API) ----------------------------------------------------


def _bad_flow(n: int, **kw: Any) -> onceq.Flow:
    t = MemoryTransport()
    for i in range(n):
        t.publish(json.dumps({"invoiceId": f"I{i}"}).encode())
    return onceq.Flow("inv", t, MessageSpec(id_field="invoice_id"), **kw)


def test_the_api_raises_misconfigured_when_the_guard_stops_a_flow(tmp_path: Path) -> None:
    flow = _bad_flow(50)
    with pytest.raises(onceq.Misconfigured, match=r"flow inv: misconfigured\? the first 10"):
        onceq.run(flow, ledger=tmp_path / "l.db", until_empty=True)
    assert len(flow.source.queue) == 40


def test_the_api_raises_all_failed_for_a_batch_below_the_threshold(tmp_path: Path) -> None:
    with pytest.raises(onceq.AllFailed, match="flow inv: every message failed: 3 dead") as info:
        onceq.run(_bad_flow(3), ledger=tmp_path / "l.db", until_empty=True)
    assert info.value.exit_code == 11 and info.value.stats["inv"].dead == 3
    # Off: every one dead, and still a batch that only failed.
    with pytest.raises(onceq.AllFailed, match="30 dead"):
        onceq.run(
            _bad_flow(30, guard=GuardPolicy.off()), ledger=tmp_path / "m.db", until_empty=True
        )
    # Not a batch (a service stopped by max_seconds): no verdict on the whole.
    stats = onceq.run(_bad_flow(3), ledger=tmp_path / "n.db", max_seconds=0.5)
    assert stats["inv"].dead == 3


def test_a_flows_guard_must_be_a_guard_policy() -> None:
    with pytest.raises(UsageError, match="guard must be a GuardPolicy"):
        onceq.Flow("f", MemoryTransport(), guard=10).validate()  # type: ignore[arg-type]


def test_any_other_reason_is_named_without_its_detail() -> None:
    """A partner's 422 body may quote the message: the hint names the reason only."""
    g = guard(2)
    g.feed(R, "http-422", "customer ACME has no credit")
    assert g.feed(R, "http-422", "customer ACME has no credit")
    hint = g.hint()
    assert "all failed with http-422: the same rejection every time" in hint
    assert "ACME" not in hint


# --- the flags (onceq._cli.retry_options) ------------------------------------------------


def test_the_guard_flags_over_a_preset_and_an_own_flow() -> None:
    from onceq._cli.retry_options import apply_retry
    from onceq._exercise.orders import orders_flow
    from onceq._flows.flow import Flow
    from onceq._sources.dirq.plugin import DirSource

    preset = orders_flow("/nonexistent")
    assert preset.guard_policy() == GuardPolicy.exercise_rule()
    assert preset.misconfig_guard() is None  # the exercise's rule: no guard
    on = apply_retry(preset, {"guard": None, "guard_failures": 5})
    # A number turns it on, and the preset keeps its exit rule (all failed: still 0).
    assert on.guard_policy() == GuardPolicy(failures=5, exercise=True)
    own = Flow("f", DirSource(Path("/nonexistent")))
    assert own.guard_policy() == GuardPolicy() and own.misconfig_guard() is not None
    assert apply_retry(own, {"guard": False, "guard_failures": None}).misconfig_guard() is None
    with pytest.raises(UsageError, match="--guard-failures: the guard is off"):
        apply_retry(own, {"guard": False, "guard_failures": 3})
    values = {"guard": None, "guard_failures": None, "other": 1}
    assert apply_retry(own, values) is own and values == {"other": 1}
