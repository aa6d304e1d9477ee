"""onceq._sources.amqp.wire without a broker: content-header frames as other clients encode them."""

from __future__ import annotations

import struct
from typing import Any

import pika
import pytest
from pamqp import frame, header
from pamqp.exceptions import UnmarshalingException

from mq_malformed_support import long_str, nested_tables, raw_fields, timestamp
from onceq._core.outcome import decode_safely
from onceq._core.transport import Delivery, Kind
from onceq._sources.amqp import wire

wire.install()


def _frame(props: dict[str, Any]) -> bytes:
    """A content-header frame of channel 1 for a 3-byte body, encoded by pika."""
    with raw_fields():
        encoded = b"".join(pika.BasicProperties(**props).encode())
    payload = struct.pack(">HHQ", 60, 0, 3) + encoded
    return struct.pack(">BHI", 2, 1, len(payload)) + payload + b"\xce"


def _decode(props: dict[str, Any]) -> Any:
    _, _, content_header = frame.unmarshal(_frame(props))
    assert content_header.body_size == 3  # the body is still read: the message is delivered
    return content_header.properties


NAME = "its name is not UTF-8 text"
CASES: list[tuple[dict[str, Any], tuple[str, str] | None]] = [
    ({"headers": {b"x-\xff": "v"}}, ("encoding", f"header 'x-\\xff': {NAME}")),
    ({"headers": {"a": {"b": [{b"\xfe": 1}]}}}, ("encoding", f"header 'a'.'b'[0].'\\xfe': {NAME}")),
    ({"headers": {b"x\n\x1b\xff": 1}}, ("encoding", f"header 'x\\x0a\\x1b\\xff': {NAME}")),
    # A long string that is not UTF-8 is binary, valid AMQP: no verdict, at any depth.
    ({"headers": {"k": long_str(b"\xff"), "a": {"b": [long_str(b"\xfe")]}}}, None),
    ({"app_id": b"\xc0"}, ("encoding", "property app_id: not UTF-8 text")),
    ({"type": b"\xc0"}, ("encoding", "property type: not UTF-8 text")),
    (
        {"headers": {"d": nested_tables(900)}},
        ("bad-property", "its content header could not be decoded (RecursionError)"),
    ),
    # Valid, however odd: a byte array, a timestamp past 9999 (property and header).
    ({"headers": {"ok": "é", "x": b"\xff", "t": timestamp(2**63)}, "timestamp": 2**64 - 1}, None),
]


@pytest.mark.parametrize(("props", "expected"), CASES)
def test_verdict_names_where_never_a_value(props: dict[str, Any], expected: Any) -> None:
    assert wire.verdict(_decode(props)) == expected


def test_a_header_value_never_reaches_the_detail() -> None:
    secret = b"s3cr3t-\xff"
    props = {"headers": {"token": long_str(secret), "t\xff".encode("latin-1"): 1}}
    reason, detail = wire.verdict(_decode(props)) or ("", "")
    assert reason == "encoding" and "s3cr3t" not in detail and "'t\\xff'" in detail


def test_a_long_header_name_is_cut_in_the_detail() -> None:
    _, detail = wire.verdict(_decode({"headers": {b"n" * 200 + b"\xff": 1}})) or ("", "")
    assert len(detail) < 120 and detail.startswith("header 'nnnn")


def test_a_timestamp_past_9999_is_written_back_unchanged() -> None:
    """A retry copy or a replay re-encodes the properties: the 64-bit value survives."""
    props = _decode({"timestamp": 2**63, "headers": {"t": timestamp(2**64 - 1)}})
    assert isinstance(props.timestamp, wire.OutOfRange)
    again = header.ContentHeader(0, 3, props).marshal()
    _, _, back = frame.unmarshal(struct.pack(">BHI", 2, 1, len(again)) + again + b"\xce")
    assert back.properties.timestamp.raw == 2**63
    assert back.properties.headers["t"].raw == 2**64 - 1


def test_valid_properties_decode_as_pamqp_decodes_them() -> None:
    props = _decode({"message_id": "m-\u20ac", "headers": {"a": [1, "x", {"b": None}]}})
    assert props.message_id == "m-\u20ac" and props.headers == {"a": [1, "x", {"b": None}]}
    assert wire.verdict(props) is None


def test_a_frame_too_short_for_its_body_size_keeps_its_error() -> None:
    """Not a message at all: nothing to deliver, so the decoder's error stands."""
    payload = b"\x00\x3c\x00"
    data = struct.pack(">BHI", 2, 1, len(payload)) + payload + b"\xce"
    with pytest.raises(UnmarshalingException):
        frame.unmarshal(data)


def test_the_loop_dead_letters_a_refused_delivery_without_decoding_it() -> None:
    called = []

    def decode(d: Delivery) -> Any:
        called.append(d)
        raise AssertionError("never decoded")

    d = Delivery(body=b"{}", ref="q/1", refused=("encoding", "property type: not UTF-8 text"))
    outcome = decode_safely(decode, d)  # the loop's decoder boundary
    assert (outcome.kind, outcome.reason, outcome.detail) == (
        Kind.REJECTED,
        "encoding",
        "property type: not UTF-8 text",
    )
    assert called == [] and d.msg_id is None


def test_replay_refuses_a_malformed_letter_and_one_it_cannot_encode_again() -> None:
    from pamqp.commands import Basic

    from onceq._sources.amqp.dead_letter import DeadLetter, republish_problem

    def letter(props: Any) -> DeadLetter:
        return DeadLetter(0, "m", 1, [], properties=props, refused=wire.verdict(props))

    bad = _decode({"headers": {b"x-\xff": "v"}})
    assert republish_problem(letter(bad)) == "header 'x-\\xff': its name is not UTF-8 text"
    odd = Basic.Properties(headers={"k": {1, 2}})  # a set: no AMQP field type
    assert republish_problem(letter(odd)) == "its properties cannot be encoded again (TypeError)"
    fine = _decode({"headers": {"t": timestamp(2**63)}, "message_id": "m"})
    assert republish_problem(letter(fine)) == ""
