"""wire.verdict's one-pass path answers exactly as the full walk (`_verdict`) does."""

from __future__ import annotations

from typing import Any, ClassVar

from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from onceq._sources.amqp import wire

# Text as a broker may carry it: ASCII, other UTF-8, lone surrogates (bytes that were
# not UTF-8, read with surrogateescape), the note of an undecodable header.
texts = st.one_of(
    st.text(alphabet=st.characters(max_codepoint=127), max_size=8),
    st.text(max_size=6),
    st.builds(lambda s: s + "\udcff", st.text(max_size=4)),
)
scalars = st.one_of(st.none(), st.integers(), st.booleans(), st.binary(max_size=4), texts)
values = st.recursive(
    st.one_of(scalars, st.builds(wire.Undecodable, texts)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(texts, inner, max_size=3)),
    max_leaves=8,
)
props = st.builds(
    commands.Basic.Properties,
    message_id=st.one_of(st.none(), texts),
    content_type=st.one_of(st.none(), texts),
    app_id=st.one_of(st.none(), texts),
    message_type=st.one_of(st.none(), texts),
    headers=st.one_of(st.none(), st.dictionaries(texts, values, max_size=4)),
)


@settings(max_examples=200, deadline=None)
@given(props)
def test_the_fast_path_answers_as_the_full_walk(p: Any) -> None:
    assert wire.verdict(p) == wire._verdict(p)


def test_the_common_delivery_takes_the_fast_path() -> None:
    """A claim as `onceq mq publish` sends it: no verdict, and no full walk either."""
    p = commands.Basic.Properties(
        message_id="6f1c", content_type="application/json", delivery_mode=2,
        headers={"x-onceq-copy": "a1b2c3", "n": 3},
    )  # fmt: skip
    walked: list[Any] = []
    original = wire._verdict
    wire._verdict = lambda q: walked.append(q) or original(q)  # type: ignore[assignment]
    try:
        assert wire.verdict(p) is None
    finally:
        wire._verdict = original
    assert walked == []


def test_an_aio_pika_shaped_message_goes_the_full_way() -> None:
    """`type` instead of pamqp's message_type: the full walk reads it."""

    class Message:
        message_id = "m"
        type = "t\udcff"
        headers: ClassVar[dict[str, Any]] = {}

    assert wire.verdict(Message()) == ("encoding", "property type: not UTF-8 text")
