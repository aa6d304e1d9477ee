"""Whatever properties a broker carries, a delivery must reach the loop, not kill the connection.

AMQP's content header (the properties: message_id, content_type, … and the headers
table) is bytes on the wire that pamqp decodes inside aiormq's frame reader. Where
that decode raises, the connection drops (InvalidFrameError), the robust connection
reconnects, the broker redelivers the same message first — with everything else of
its prefetch window — and the consumer loops on it for ever: one message stops the
queue. RabbitMQ itself refuses an unknown field type, a delivery_mode other than 1
or 2, an expiration that is not an integer and a foreign user_id at the publish, but
carries these, all of which pamqp 4 chokes on:

| shape (another client sent it)                      | pamqp alone         | here            |
| a shortstr property that is not UTF-8 (message_id,  | UnicodeDecodeError  | surrogateescape |
|   content_type, type, app_id, reply_to, …)          |                     |                 |
| a header-table key that is not UTF-8, at any depth  | UnicodeDecodeError  | surrogateescape |
| a timestamp past year 9999 (property or header)     | ValueError          | `OutOfRange`    |
| a table nested deeper than Python's recursion limit | RecursionError      | `Undecodable`   |
| anything else the header frame fails on             | (drops the link)    | `Undecodable`   |

(A header *value* that is not UTF-8 pamqp already returns as bytes, and it stays a
message like any other: AMQP's long string is binary-safe, and a Java or Go producer
puts bytes there on purpose — the connection never choked on it.) `install` puts
the tolerant decoders into pamqp, so every such message is delivered; `verdict` then
names what is wrong with it, and the loop dead-letters it with that reason instead of
trying it (`encoding`: text that is not UTF-8, in a property or a header's name;
`bad-property`: a content header that could not be decoded).
A timestamp past 9999 is valid AMQP that only Python's datetime cannot hold: the
message is processed, and its value is written back unchanged in a retry copy or a
replay. Valid input decodes exactly as before.
"""

from __future__ import annotations

import operator
import struct
from datetime import UTC, datetime
from typing import Any

from onceq._core.values import CONTROL_CHARS, is_utf8

# The reasons `verdict` gives (see the table above).
ENCODING = "encoding"
BAD_PROPERTY = "bad-property"
# Where `Undecodable` puts its note: a header table that replaced one pamqp could not read.
UNDECODABLE_HEADER = "onceq-undecodable"
# The shortstr properties, by pamqp's attribute name → the AMQP name a detail shows.
TEXT_PROPERTIES = {
    "content_type": "content_type",
    "content_encoding": "content_encoding",
    "correlation_id": "correlation_id",
    "reply_to": "reply_to",
    "expiration": "expiration",
    "message_id": "message_id",
    "message_type": "type",
    "type": "type",  # aio-pika's name for it
    "user_id": "user_id",
    "app_id": "app_id",
    "cluster_id": "cluster_id",
}
NAME_MAX = 60  # a header name in a detail: enough to find it, never a page
_installed = False


class OutOfRange(datetime):
    """A timestamp datetime cannot hold (past year 9999): shown as the latest one,
    and encoded back as its `raw` 64-bit value (so a copy carries it unchanged)."""

    raw: int = 0


class Undecodable(str):
    """The note that replaces a content header pamqp could not decode (why, not what)."""


def install() -> None:
    """Install the tolerant decoders into pamqp (idempotent); see the module doc."""
    global _installed
    if _installed:
        return
    from pamqp import decode, encode, frame

    strict_timestamp = decode.timestamp
    strict_encode_timestamp = encode.timestamp
    strict_header_frame = frame._unmarshal_header_frame

    def short_str(value: bytes) -> tuple[int, str]:
        # pamqp's own body with surrogateescape, in one frame rather than a call to
        # pamqp's and a retry on failure: five shortstrs a delivery (its consumer tag,
        # exchange, routing key, content type, message_id), each a second Python call
        # before. Valid UTF-8 decodes the same either way.
        try:
            length = value[0]
            return length + 1, value[1 : length + 1].decode("utf-8", "surrogateescape")
        except (IndexError, TypeError) as err:  # pamqp's error for a truncated frame
            raise ValueError("Could not unpack short string value") from err

    def timestamp(value: bytes) -> tuple[int, datetime]:
        try:
            return strict_timestamp(value)
        except (ValueError, OverflowError, OSError):
            marker = OutOfRange(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
            marker.raw = struct.unpack(">Q", value[0:8])[0]
            return 8, marker

    def encode_timestamp(value: Any) -> bytes:
        if isinstance(value, OutOfRange):
            return struct.pack(">Q", value.raw)
        return strict_encode_timestamp(value)

    def field_table(value: bytes) -> tuple[int, dict[str, Any]]:
        # pamqp's field_table with one change: a key that is not UTF-8 is kept
        # (surrogateescape) instead of raising for the whole frame.
        try:
            length = struct.unpack(">I", value[0:4])[0]
        except struct.error as err:
            raise ValueError("Could not unpack data") from err
        end = 4 + length
        if end > len(value):
            raise ValueError("Field table length exceeds available data")
        offset, data = 4, {}
        while offset < end:
            key_length = value[offset]
            offset += 1
            if offset + key_length > end:
                raise ValueError("Field table key length exceeds data")
            key = value[offset : offset + key_length].decode("utf-8", "surrogateescape")
            offset += key_length
            consumed, result = decode.embedded_value(value[offset:])
            offset += consumed
            data[key] = result
        return end, data

    def header_frame(frame_data: bytes) -> Any:
        try:
            return strict_header_frame(frame_data)
        except Exception as exc:  # any failure is this message's, not the connection's
            return _undecodable(frame_data, exc)

    tolerant: dict[str, Any] = {
        "shortstr": short_str,
        "timestamp": timestamp,
        "table": field_table,
    }
    decode.short_str = tolerant["shortstr"]
    decode.timestamp = tolerant["timestamp"]
    decode.field_table = tolerant["table"]
    decode.METHODS.update(tolerant)
    decode.TABLE_MAPPING[b"T"] = tolerant["timestamp"]
    decode.TABLE_MAPPING[b"F"] = tolerant["table"]
    enc: Any = encode_timestamp
    encode.timestamp = enc
    encode.METHODS["timestamp"] = enc
    frame._unmarshal_header_frame = header_frame
    _installed = True


# The name before issue 17 (the message_id fix); one installer does all of it now.
tolerate_non_utf8_shortstr = install


def _undecodable(frame_data: bytes, exc: Exception) -> Any:
    """A content header with the frame's body size and a note instead of its properties.

    The body size comes first in the frame and is all aiormq needs to read the body,
    so the message is still delivered (and dead-lettered, `verdict`); a frame too
    short to hold it is not a message at all, and its error stands.
    """
    from pamqp import commands, header

    try:
        _, weight, body_size = struct.unpack(">HHQ", frame_data[0:12])
    except struct.error:
        raise exc from None
    # The type only: a decoder's message may quote the bytes it choked on.
    note = Undecodable(f"its content header could not be decoded ({type(exc).__name__})")
    props = commands.Basic.Properties(headers={UNDECODABLE_HEADER: note})
    return header.ContentHeader(weight, body_size, props)


# pamqp's names of the text properties (`type` is aio-pika's): read in one C call.
_PAMQP_TEXT = operator.attrgetter(*(a for a in TEXT_PROPERTIES if a != "type"))


def verdict(props: Any) -> tuple[str, str] | None:
    """(reason, detail) when a delivery's properties cannot be taken as they are, else None.

    `props` is a pamqp Basic.Properties or an aio-pika message (the same attributes,
    but `type` for `message_type`). The detail names the property or header, never a
    value (header values may be secrets): `header 'x-\\xff': its name is not UTF-8 text`.

    This runs for every delivery, so the common case — pamqp's properties, every text
    ASCII, a flat header table of ASCII names and plain values — is answered in one pass
    (callgrind: 3,000 deliveries of the claims preset); anything else, including every
    message that has something to say, is walked by `_verdict`, the one that decides.
    """
    try:
        # A TypeError: a property that is not text where text belongs; AttributeError:
        # not pamqp's properties (aio-pika's message). Both: the full walk decides.
        texts = "".join([v for v in _PAMQP_TEXT(props) if v is not None])
    except (AttributeError, TypeError):
        return _verdict(props)
    if not texts.isascii():
        return _verdict(props)
    headers = props.headers
    if headers is None:
        return None
    if headers.__class__ is not dict:
        return _verdict(props)
    for key, item in headers.items():
        if key.__class__ is not str or not key.isascii():
            return _verdict(props)
        if item.__class__ is str:
            if not item.isascii():
                return _verdict(props)
        elif isinstance(item, dict | list | str):  # nested, or an `Undecodable` note
            return _verdict(props)
    return None


def _verdict(props: Any) -> tuple[str, str] | None:
    """`verdict`'s full walk: every text property, every header at any depth."""
    for attr, name in TEXT_PROPERTIES.items():
        value = getattr(props, attr, None)
        if isinstance(value, str) and not is_utf8(value):
            return ENCODING, f"property {name}: not UTF-8 text"
    headers = getattr(props, "headers", None)
    if not isinstance(headers, dict):
        return None
    # An explicit stack, not recursion: the table may be nested as deep as pamqp read it.
    # Each entry carries the raw keys and indices that lead to it; the path is written
    # out only for a verdict (this runs for every delivery: nothing is formatted then).
    stack: list[tuple[tuple[Any, ...], Any]] = [((), headers)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, Undecodable):
            return BAD_PROPERTY, str(value)
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str) and not is_utf8(key):
                    return ENCODING, f"header {_path((*where, key))}: its name is not UTF-8 text"
                if isinstance(item, dict | list | str):
                    stack.append(((*where, key), item))
        elif isinstance(value, list):
            stack.extend(((*where, i), item) for i, item in enumerate(value))
        elif isinstance(value, str) and not is_utf8(value):
            # Not bytes: a long string that is not UTF-8 is binary, valid AMQP (pamqp
            # returns it as bytes, and a retry copy carries it as a byte array).
            return ENCODING, f"header {_path(where)}: its value is not UTF-8 text"
    return None


def _path(steps: tuple[Any, ...]) -> str:
    """`'a'.'b'[0]`: a header's place, from the keys (shown) and indices that lead to it."""
    out = ""
    for step in steps:
        if isinstance(step, int):
            out += f"[{step}]"
        else:
            out += f".{show(step)}" if out else show(step)
    return out


def show(name: Any) -> str:
    """A header's name for a detail: quoted, its undecodable bytes and controls escaped."""
    if not isinstance(name, str):
        return repr(name)
    try:  # the wire's bytes back (a key decoded with surrogateescape), then escaped
        data = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # another lone surrogate: not from the wire
        data = name.encode("utf-8", "backslashreplace")
    raw = data.decode("utf-8", "backslashreplace")
    raw = CONTROL_CHARS.sub(lambda m: f"\\x{ord(m.group()):02x}", raw)
    if len(raw) > NAME_MAX:
        raw = raw[:NAME_MAX] + "…"
    return f"'{raw}'"
