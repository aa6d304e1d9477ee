"""Message files, read and checked before any is published: one rule on every broker.

`onceq mq publish` and `onceq nats publish` (and a dead letter's corrected body) read
their files here: the size checked before a byte is read, UTF-8, one JSON object, the
id at its field (a dotted path) storable as a message id. Nothing is published unless
every file is valid: a batch that fails half-way would leave the user to work out
which messages went out.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from onceq._core.fields import FieldPath, get_path
from onceq._core.fields import split_path as _split
from onceq._core.values import CONTROL_CHARS, is_utf8
from onceq.errors import BadMessage, NotFound

__all__ = [
    "ID_FIELD",
    "MAX_BODY",
    "MAX_MESSAGE_ID",
    "Message",
    "id_problem",
    "load_message",
    "load_messages",
]

# RabbitMQ's default max_message_size. A larger body is refused by the broker with a
# channel-closing 406 half-way through a batch; checked from the file's size first,
# so such a file publishes nothing and is never read into memory.
MAX_BODY = 128 * 2**20
# message_id is an AMQP shortstr: one length byte, so at most 255 bytes of UTF-8. One
# rule on every broker: an id one transport takes, every other takes too.
MAX_MESSAGE_ID = 255


# The claims preset's id field, every publish command's default.
ID_FIELD = "guid"


# Plain classes, not dataclasses: the decorator's generated code is run at every
# start of `onceq mq publish` (~1 ms for the two), and a frozen one's __init__ sets
# each field through object.__setattr__, once per file.
class Message:
    """One message file: its exact bytes and the id that becomes its message_id."""

    __slots__ = ("body", "msg_id", "path")

    def __init__(self, path: Path, body: bytes, msg_id: str) -> None:
        self.path = path
        self.body = body
        self.msg_id = msg_id

    def __repr__(self) -> str:
        return f"Message(path={self.path!r}, msg_id={self.msg_id!r}, {len(self.body)} bytes)"

    @property
    def guid(self) -> str:  # the claims preset's word for it
        return self.msg_id


def load_message(path: Path, id_field: str = ID_FIELD) -> Message:
    """Read and check one message file; BadMessage names the file and the reason."""
    return _load(path, _split(id_field, "id_field"), id_field)


# os.open/fstat/read instead of Path.stat + Path.read_bytes: the same checks (the size
# before any byte is read) in half the system calls and none of the buffered file
# object: 18 µs -> 7 µs a file, measured, on a per-file path that a 5,000-file publish
# runs before its first message goes out.
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


def _read(path: Path) -> bytes:
    try:
        fd = os.open(path, _READ_FLAGS)
        try:
            size = os.fstat(fd).st_size
            if size > MAX_BODY:
                raise BadMessage(
                    f"{path}: too large ({size} bytes; the broker accepts at most {MAX_BODY})"
                )
            body = os.read(fd, size + 1)  # one byte more: the end of the file is seen
            if len(body) > size:  # it grew since, or has no size (a pipe): to its end
                chunks = [body]
                while chunk := os.read(fd, 1 << 16):
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > MAX_BODY:
                        raise BadMessage(
                            f"{path}: too large (over {MAX_BODY} bytes, the most the broker"
                            " accepts)"
                        )
                body = b"".join(chunks)
        finally:
            os.close(fd)
    except FileNotFoundError:  # a missing file is exit 3 in every command, not a bad message
        raise NotFound(f"{path}: no such file") from None
    except OSError as exc:
        raise BadMessage(f"{path}: cannot read: {exc.strerror or exc}") from None
    return body


_BOM = b"\xef\xbb\xbf"


def _load(path: Path, where: FieldPath, id_field: str) -> Message:
    body = _read(path)
    try:
        # As decode("utf-8-sig") does (its error offsets too: after the mark), without
        # the codec registry's Python-level decode function per file.
        text = body[3:].decode() if body[:3] == _BOM else body.decode()
        doc = json.loads(text)
    except UnicodeDecodeError as exc:
        raise BadMessage(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise BadMessage(
            f"{path}: not JSON (line {exc.lineno} column {exc.colno}: {exc.msg})"
        ) from None
    except RecursionError:
        raise BadMessage(f"{path}: not JSON (nested too deeply)") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise BadMessage(f"{path}: not JSON ({str(exc).split(';')[0][:200]})") from None
    if not isinstance(doc, dict):
        raise BadMessage(f"{path}: not a JSON object (top level is {type(doc).__name__})")
    # The consumer's own dotted-path lookup (one rule for "invoice.id" on both sides).
    msg_id = get_path(doc, where)
    if isinstance(msg_id, int) and not isinstance(msg_id, bool):
        msg_id = str(msg_id)
    if not isinstance(msg_id, str) or not msg_id.strip():
        raise BadMessage(f"{path}: no {id_field} (a non-empty string is needed for message_id)")
    problem = id_problem(msg_id)
    if problem:
        raise BadMessage(f"{path}: {id_field} {problem}")
    return Message(path, body, msg_id)


def id_problem(msg_id: str) -> str:
    """Why `msg_id` cannot be a message_id, or ''.

    Found while sending, each of these was a traceback half-way through a batch
    (UnicodeEncodeError, the shortstr encoder's error), with some claims already out.
    A consumer would refuse the control characters too: the id becomes its
    Idempotency-Key header, which cannot carry them.
    """
    if msg_id.isascii():  # the usual id: its own UTF-8, one byte a character
        size = len(msg_id)
    elif not is_utf8(msg_id):
        return "holds a lone surrogate (\\ud800-\\udfff), not Unicode text"
    else:
        size = len(msg_id.encode("utf-8"))
    if size > MAX_MESSAGE_ID:
        return f"is {size} bytes; a message id holds at most {MAX_MESSAGE_ID} (an AMQP message_id)"
    if CONTROL_CHARS.search(msg_id):
        return "holds a control character (it becomes an HTTP header)"
    return ""


def load_messages(paths: list[Path], id_field: str = ID_FIELD) -> list[Message]:
    """Every file checked before any is published; all problems reported in one line."""
    messages: list[Message] = []
    problems: list[BadMessage | NotFound] = []
    where = _split(id_field, "id_field")  # checked once, not per file
    for p in paths:
        try:
            messages.append(_load(p, where, id_field))
        except (BadMessage, NotFound) as exc:
            problems.append(exc)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        text = "; ".join(map(str, problems[:3]))
        # The first problem decides the exit code, as if the files were checked one by one.
        raise type(problems[0])(f"{text}{more}; nothing was published")
    return messages
