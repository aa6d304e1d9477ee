"""Messages with malformed AMQP properties, as another client publishes them (issue 17).

pika sends whatever bytes it is given for a shortstr property or a header name; for
what it will not encode (a long string `S` that is not UTF-8, a timestamp past 9999,
a table nested deeper than its own recursion) `raw_fields` lets a test put a field's
exact bytes in a header table (`Raw`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pika
import pika.data

# Short-string properties of Basic.Properties (pika's names). RabbitMQ refuses a
# user_id that is not the connection's user and an expiration that is not an integer
# at the publish (406), so those two never reach a consumer (test_broker_refuses_…).
SHORTSTR_PROPERTIES = (
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "message_id",
    "type",
    "app_id",
    "cluster_id",
)
# Bytes that are never part of UTF-8, wherever they stand.
NEVER_UTF8 = (b"\xff", b"\xfe", b"\xc0", b"\xc1", b"\xf5", b"\xf8")


class Raw:
    """A header value sent as these exact bytes (type octet included)."""

    def __init__(self, encoded: bytes) -> None:
        self.encoded = encoded

    def __repr__(self) -> str:
        return f"Raw({self.encoded[:16]!r})"


def long_str(data: bytes) -> Raw:
    """An `S` field holding `data` as it is (pika would send bytes as a byte array)."""
    return Raw(b"S" + struct.pack(">I", len(data)) + data)


def timestamp(value: int) -> Raw:
    return Raw(b"T" + struct.pack(">Q", value))


def nested_tables(depth: int) -> Raw:
    """{"a": {"a": … 1}} `depth` tables deep."""
    inner = b"I" + struct.pack(">i", 1)
    for _ in range(depth):
        entry = b"\x01a" + inner
        inner = b"F" + struct.pack(">I", len(entry)) + entry
    return Raw(inner)


@contextmanager
def raw_fields() -> Iterator[None]:
    """pika's table encoder with `Raw` values passed through unchanged."""
    original = pika.data.encode_value

    def encode_value(pieces: list[bytes], value: Any) -> int:
        if isinstance(value, Raw):
            pieces.append(value.encoded)
            return len(value.encoded)
        return original(pieces, value)

    pika.data.encode_value = encode_value  # type: ignore[assignment]
    try:
        yield
    finally:
        pika.data.encode_value = original  # type: ignore[assignment]


def publish_raw(url: str, messages: list[tuple[dict[str, Any], bytes]]) -> None:
    """Each (pika BasicProperties keywords, body) to eai.claim/claim, confirmed, mandatory."""
    with raw_fields():
        conn = pika.BlockingConnection(pika.URLParameters(url))
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            for props, body in messages:
                ch.basic_publish(
                    "eai.claim", "claim", body, pika.BasicProperties(**props), mandatory=True
                )
        finally:
            conn.close()
