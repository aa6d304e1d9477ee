"""onceq._sources.amqp.dead_letter: selection rules, --since, x-death reading, a replayed copy's
properties. Pure functions; the broker side is tests/integration/test_mq_dead.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pamqp.commands import Basic

from onceq._sources.amqp.dead_letter import (
    UNKNOWN,
    DeadLetter,
    Death,
    Selection,
    copy_id_of,
    deaths_of,
    msg_id_of,
    parse_since,
    replay_properties,
    republish_problem,
)
from onceq.errors import UsageError

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def letter(msg_id: str | None = "a", reason: str | None = "http-503", **kw: object) -> DeadLetter:
    info = None if reason is None else {"reason": reason, "detail": "", "at": None, "attempts": 2}
    return DeadLetter(position=0, msg_id=msg_id, size=3, deaths=[], info=info, **kw)  # type: ignore[arg-type]


def test_change_needs_exactly_one_filter() -> None:
    with pytest.raises(UsageError, match="give --all, --id"):
        Selection.for_change(False, (), None)
    with pytest.raises(UsageError, match="--all and --reason"):
        Selection.for_change(True, (), "http-503")
    with pytest.raises(UsageError, match="--id and --reason"):
        Selection.for_change(False, ("a",), "x")
    with pytest.raises(UsageError, match="names no reason"):
        Selection.for_change(False, (), " ")
    s = Selection.for_change(False, ("a", "b", "a"), None)
    assert s.ids == ("a", "b")  # a repeated --id is one id
    assert s.as_dict() == {"ids": ["a", "b"]}
    assert Selection.for_change(True, (), None).as_dict() == {"all": True}


def test_matches_by_id_reason_and_unknown() -> None:
    assert Selection(ids=("a",)).matches(letter("a"))
    assert not Selection(ids=("a",)).matches(letter("b"))
    assert not Selection(ids=("a",)).matches(letter(None))
    assert Selection(reason="http-503").matches(letter())
    assert not Selection(reason="http-422").matches(letter())
    # No ledger row: its reason is 'unknown', and --reason unknown selects it.
    bare = letter(reason=None)
    assert bare.reason == UNKNOWN and bare.attempts is None
    assert Selection(reason=UNKNOWN).matches(bare)
    assert Selection(all=True).matches(bare)


def test_since_uses_the_ledger_time_else_the_newest_x_death() -> None:
    old = NOW - timedelta(hours=3)
    recent = NOW - timedelta(minutes=5)
    from_ledger = letter()
    from_ledger.info["at"] = recent.isoformat()  # type: ignore[index]
    from_broker = letter(reason=None)
    from_broker.deaths = [Death("claim.in", "rejected", 1, old), Death("q", "expired", 1, recent)]
    never = letter(reason=None)  # no ledger row, no x-death: its time is not known
    since = Selection(since=NOW - timedelta(hours=1))
    assert since.matches(from_ledger)
    assert from_broker.dead_at == recent and since.matches(from_broker)
    assert not since.matches(never)
    assert not Selection(since=NOW).matches(from_ledger)


def test_parse_since() -> None:
    assert parse_since("1h", NOW) == NOW - timedelta(hours=1)
    assert parse_since("90s", NOW) == NOW - timedelta(seconds=90)
    assert parse_since("2026-11-30T10:00:00Z", NOW) == datetime(2026, 11, 30, 10, tzinfo=UTC)
    # An ISO time without a zone is UTC (the ledger's times are UTC).
    assert parse_since("2026-11-30T10:00:00", NOW) == datetime(2026, 11, 30, 10, tzinfo=UTC)
    for bad in ("yesterday", "-1h", "", "1x"):
        with pytest.raises(UsageError, match="--since"):
            parse_since(bad, NOW)


def test_deaths_are_read_defensively() -> None:
    when = datetime(2026, 11, 30, tzinfo=UTC)
    headers = {
        "x-death": [
            {"queue": "claim.in", "reason": "rejected", "count": 2, "time": when},
            "garbage",
            {"queue": "q", "count": True},  # a client may publish any x-death (3.x keeps it)
        ]
    }
    assert deaths_of(headers) == [
        Death("claim.in", "rejected", 2, when),
        Death("q", "", 0, None),
    ]
    assert deaths_of(None) == [] and deaths_of({"x-death": "no"}) == []


def test_msg_id_is_the_property_else_the_body_field() -> None:
    body = b'{"guid": "g-1", "h": {"id": 7}}'
    assert msg_id_of("prop", body, "guid") == "prop"
    assert msg_id_of(None, body, "guid") == "g-1"
    assert msg_id_of("  ", body, "h.id") == "7"  # a blank property: the body decides
    assert msg_id_of(None, b"not json", "guid") is None
    assert msg_id_of(None, b"[1]", "guid") is None
    assert msg_id_of(None, body, "missing") is None
    assert msg_id_of(None, body, None) is None


def test_copy_id() -> None:
    assert copy_id_of({"x-onceq-copy": "abc"}) == "abc"
    assert copy_id_of({"x-onceq-copy": "x" * 65}) is None
    assert copy_id_of({"x-onceq-copy": 5}) is None
    assert copy_id_of(None) is None


def test_replayed_properties_drop_the_broker_headers_and_keep_the_rest() -> None:
    props = Basic.Properties(
        content_type="application/json",
        message_id="m-1",
        delivery_mode=1,
        correlation_id="c",
        user_id="someone-else",
        headers={
            "x-death": [{"queue": "claim.in"}],
            "x-first-death-queue": "claim.in",
            "x-last-death-reason": "rejected",
            "x-onceq-copy": "abc",
            "tenant": "acme",
            "onceq-replays": 2,
        },
    )
    x = letter(properties=props)
    out = replay_properties(x, "guest")
    assert out.headers == {"x-onceq-copy": "abc", "tenant": "acme", "onceq-replays": 3}
    assert out.delivery_mode == 2  # persistent, whatever the original said
    assert (out.message_id, out.content_type, out.correlation_id) == (
        "m-1",
        props.content_type,
        "c",
    )
    assert out.user_id is None  # the broker refuses a user_id that is not the login's
    assert props.headers["onceq-replays"] == 2 and props.delivery_mode == 1  # not changed
    mine = replay_properties(letter(properties=Basic.Properties(user_id="guest")), "guest")
    assert mine.user_id == "guest" and mine.headers == {"onceq-replays": 1}


def test_a_non_utf8_property_cannot_be_republished() -> None:
    bad = letter(properties=Basic.Properties(message_id="id-\udcff"))
    assert republish_problem(bad) == "property message_id: not UTF-8 text"
    # Whatever else the encoder refuses is named too, never raised half-way through a replay.
    odd = letter(properties=Basic.Properties(priority=256))
    assert republish_problem(odd).startswith("its properties cannot be encoded again")
    assert republish_problem(letter(properties=Basic.Properties(message_id="ok"))) == ""
