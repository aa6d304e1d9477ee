"""Message files → persistent, confirmed, mandatory messages on an exchange.

The claims preset (the defaults): eai.claim, key claim, message_id from the guid.
Any other exchange, key and id field (a dotted path) work the same way.

Client choice, by measurement (5,000 claims, one connection, loopback, 2 cores):
the baseline (pika BlockingConnection, one confirm awaited per message) ran at
~1,500 msg/s; aio-pika with 256 confirms outstanding reached ~4,600-7,300 msg/s
(3-5x, its per-message Message/Exchange objects dominate); aiormq directly with the
same window reached ~8,800-10,000 msg/s (6-6.5x). So the publisher speaks aiormq:
it is the library aio-pika sits on, so its exceptions pass through the same
boundary (onceq._sources.amqp.url.translate) as the consumer's. `bench/` repeats the figure.

Nothing is published unless every file is valid: a batch that fails half-way would
leave the user to work out which claims went out.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from onceq._core.fields import FieldPath, get_path
from onceq._core.fields import split_path as _split
from onceq._core.values import CONTROL_CHARS, is_utf8
from onceq._sources.amqp.copy_header import COPY_HEADER
from onceq._sources.amqp.topology_names import EXCHANGE, ROUTING_KEY, name_problem
from onceq._sources.amqp.url import boundary, close_quietly, connect
from onceq.errors import BadMessage, NotFound, Unroutable, UsageError

# Confirms outstanding at once: enough to keep the socket busy while the broker
# fsyncs persistent messages, bounded so memory and the loss window stay small.
WINDOW = 256
CONTENT_TYPE = "application/json"
# RabbitMQ's default max_message_size. A larger body is refused by the broker with a
# channel-closing 406 half-way through a batch; checked from the file's size first,
# so such a file publishes nothing and is never read into memory.
MAX_BODY = 128 * 2**20
# message_id is an AMQP shortstr: one length byte, so at most 255 bytes of UTF-8.
MAX_MESSAGE_ID = 255


# The claims preset: message_id from the body's guid, to eai.claim with key claim.
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


Claim = Message  # the name before issue 7


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


def load_claim(path: Path) -> Message:
    return load_message(path)


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
        return f"is {size} bytes; an AMQP message_id holds at most {MAX_MESSAGE_ID}"
    if CONTROL_CHARS.search(msg_id):
        return "holds a control character (it becomes an HTTP header)"
    return ""


guid_problem = id_problem  # the name before issue 7


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


def load_claims(paths: list[Path]) -> list[Message]:
    return load_messages(paths)


class PublishReport:
    """What a publish did: counts, and the files returned or nacked (paths, in order)."""

    def __init__(
        self,
        published: int = 0,
        unroutable: list[str] | None = None,
        nacked: list[str] | None = None,
    ) -> None:
        self.published = published
        self.unroutable: list[str] = [] if unroutable is None else unroutable
        self.nacked: list[str] = [] if nacked is None else nacked

    def as_dict(self) -> dict[str, Any]:
        return {
            "published": self.published,
            "unroutable": self.unroutable,
            "nacked": self.nacked,
        }

    def problem(self, total: int, where: str, routing_key: str) -> str:
        """The one line of a run that had returns or nacks ('' when it had none).

        Counted per file: two files with one id are two messages, each published,
        returned or nacked on its own (a publish waits for the previous copy of its id).
        """
        parts = []
        if self.unroutable:
            parts.append(
                f"returned as unroutable (no queue bound to {where} for key {routing_key!r})"
                f" (first: {self.unroutable[0]})"
            )
        if self.nacked:
            parts.append(
                f"nacked by the broker ({where}, key {routing_key!r}) (first: {self.nacked[0]})"
            )
        if not parts:
            return ""
        if len(parts) == 1:
            n = len(self.unroutable) + len(self.nacked)
            return f"{n} of {total} message(s) {parts[0]}; {self.published} published"
        return (
            f"{len(self.unroutable)} of {total} message(s) {parts[0]},"
            f" {len(self.nacked)} {parts[1]}; {self.published} published"
        )


def exchange_label(exchange: str) -> str:
    return f"exchange {exchange}" if exchange else "the default exchange"


def check_target(exchange: str, routing_key: str) -> None:
    """UsageError naming the option when a name cannot go on the wire.

    Publishing to an `amq.` exchange or the default exchange ("": routed by queue
    name) is legal, unlike declaring one, so only the shortstr rules apply.
    """
    for option, value in (("--exchange", exchange), ("--routing-key", routing_key)):
        why = name_problem(value, declared=False, empty_ok=True)
        if why:
            raise UsageError(f"{option}: {value!r}: {why}")


async def publish(
    url: str,
    messages: list[Message],
    *,
    window: int = WINDOW,
    exchange: str = EXCHANGE,
    routing_key: str = ROUTING_KEY,
) -> PublishReport:
    """Publish messages to `exchange` with `routing_key` over one connection, with up
    to `window` confirms outstanding.

    Raises Unroutable (after every confirm is in) when any message was returned
    (mandatory: no queue bound for it) or nacked; the others stay published.
    """
    import aiormq
    import aiormq.exceptions as ae
    from pamqp.commands import Basic

    check_target(exchange, routing_key)
    where = exchange_label(exchange)
    report = PublishReport()
    connection = await connect(url)
    try:
        with boundary(url, where):
            # on_return_raises: a mandatory message the broker returns fails its confirm
            # with PublishError instead of passing as a plain ack.
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        slots = asyncio.Semaphore(window)
        # The copy of each id still in flight. aiormq pins a basic.return on a copy by
        # its message_id (the last one published under that id): with two copies of one
        # id out at once, the first one's return failed the second one's confirm, the
        # first passed as published, and the second return failed a future nobody read
        # ("Returning exception was never retrieved"). A copy therefore waits for the
        # previous copy of its id to be confirmed or returned (the broker sends the
        # return before the confirm), so each return names exactly its own file.
        last: dict[str, asyncio.Task[None]] = {}

        async def one(message: Message, before: asyncio.Task[None] | None) -> None:
            try:
                if before is not None:
                    await asyncio.wait([before])
                props = aiormq.spec.Basic.Properties(
                    delivery_mode=2,  # persistent: a durable queue alone loses it on restart
                    message_id=message.msg_id,
                    content_type=CONTENT_TYPE,
                    # Names this copy across redeliveries (see copy_header.py): 128
                    # random bits from the OS, as secrets.token_hex(16) gives them,
                    # without importing secrets (hashlib, hmac, random) at start-up.
                    headers={COPY_HEADER: os.urandom(16).hex()},
                )
                confirm = await channel.basic_publish(
                    message.body,
                    exchange=exchange,
                    routing_key=routing_key,
                    properties=props,
                    mandatory=True,
                    # Do not wait for the socket drain per message: the confirm is what
                    # proves the broker took it, and the window bounds what is queued.
                    # aiormq's Channel takes wait=; its AbstractChannel does not declare it.
                    wait=False,  # type: ignore[call-arg]
                )
                if isinstance(confirm, Basic.Ack):
                    report.published += 1
                else:
                    report.nacked.append(str(message.path))
            except ae.PublishError:
                report.unroutable.append(str(message.path))
            except ae.DeliveryError:
                report.nacked.append(str(message.path))
            finally:
                slots.release()

        tasks: list[asyncio.Task[None]] = []
        with boundary(url, where):
            for message in messages:
                await slots.acquire()
                task = asyncio.create_task(one(message, last.get(message.msg_id)))
                last[message.msg_id] = task
                tasks.append(task)
            # Collect every task before raising, so none is left with an unread error.
            results = await asyncio.gather(*tasks, return_exceptions=True)
            failure = next((r for r in results if isinstance(r, BaseException)), None)
            if failure is not None:
                raise failure
    finally:
        await close_quietly(connection)
    problem = report.problem(len(messages), where, routing_key)
    if problem:
        # In the files' order, not the confirms' (the same command prints the same lists).
        first = {str(m.path): i for i, m in reversed(list(enumerate(messages)))}
        report.unroutable.sort(key=first.__getitem__)
        report.nacked.sort(key=first.__getitem__)
        problem = report.problem(len(messages), where, routing_key)
        exc = Unroutable(problem)
        exc.report = report  # the CLI's --json prints it
        raise exc
    return report
