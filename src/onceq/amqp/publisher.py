"""Claim files → persistent, confirmed, mandatory messages on eai.claim.

Client choice, by measurement (5,000 claims, one connection, loopback, 2 cores):
the baseline (pika BlockingConnection, one confirm awaited per message) ran at
~1,500 msg/s; aio-pika with 256 confirms outstanding reached ~4,600-7,300 msg/s
(3-5x, its per-message Message/Exchange objects dominate); aiormq directly with the
same window reached ~8,800-10,000 msg/s (6-6.5x). So the publisher speaks aiormq:
it is the library aio-pika sits on, so its exceptions pass through the same
boundary (onceq.amqp.url.translate) as the consumer's. `bench/` repeats the figure.

Nothing is published unless every file is valid: a batch that fails half-way would
leave the user to work out which claims went out.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onceq.amqp.handler import CONTROL_CHARS
from onceq.amqp.topology import EXCHANGE, ROUTING_KEY
from onceq.amqp.transport import COPY_HEADER
from onceq.amqp.url import boundary, close_quietly, connect
from onceq.errors import BadMessage, NotFound, Unroutable
from onceq.ledger_values import is_utf8

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


@dataclass(frozen=True)
class Claim:
    """One claim file: its exact bytes and the guid that becomes the message_id."""

    path: Path
    body: bytes
    guid: str


def load_claim(path: Path) -> Claim:
    """Read and check one claim file; BadMessage names the file and the reason."""
    try:
        size = path.stat().st_size
        if size > MAX_BODY:
            raise BadMessage(
                f"{path}: too large ({size} bytes; the broker accepts at most {MAX_BODY})"
            )
        body = path.read_bytes()
    except FileNotFoundError:  # a missing file is exit 3 in every command, not a bad message
        raise NotFound(f"{path}: no such file") from None
    except OSError as exc:
        raise BadMessage(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        doc = json.loads(body.decode("utf-8-sig"))
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
    guid = doc.get("guid")
    if isinstance(guid, int) and not isinstance(guid, bool):
        guid = str(guid)
    if not isinstance(guid, str) or not guid.strip():
        raise BadMessage(f"{path}: no guid (a non-empty string is needed for message_id)")
    problem = guid_problem(guid)
    if problem:
        raise BadMessage(f"{path}: guid {problem}")
    return Claim(path, body, guid)


def guid_problem(guid: str) -> str:
    """Why `guid` cannot be a message_id, or ''.

    Found while sending, each of these was a traceback half-way through a batch
    (UnicodeEncodeError, the shortstr encoder's error), with some claims already out.
    A consumer would refuse the control characters too: the id becomes its
    Idempotency-Key header, which cannot carry them.
    """
    if not is_utf8(guid):
        return "holds a lone surrogate (\\ud800-\\udfff), not Unicode text"
    size = len(guid.encode("utf-8"))
    if size > MAX_MESSAGE_ID:
        return f"is {size} bytes; an AMQP message_id holds at most {MAX_MESSAGE_ID}"
    if CONTROL_CHARS.search(guid):
        return "holds a control character (it becomes an HTTP header)"
    return ""


def load_claims(paths: list[Path]) -> list[Claim]:
    """Every file checked before any is published; all problems reported in one line."""
    claims: list[Claim] = []
    problems: list[BadMessage | NotFound] = []
    for p in paths:
        try:
            claims.append(load_claim(p))
        except (BadMessage, NotFound) as exc:
            problems.append(exc)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        text = "; ".join(map(str, problems[:3]))
        # The first problem decides the exit code, as if the files were checked one by one.
        raise type(problems[0])(f"{text}{more}; nothing was published")
    return claims


@dataclass
class PublishReport:
    published: int = 0
    unroutable: list[str] = field(default_factory=list)  # file paths
    nacked: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "published": self.published,
            "unroutable": self.unroutable,
            "nacked": self.nacked,
        }


async def publish(url: str, claims: list[Claim], *, window: int = WINDOW) -> PublishReport:
    """Publish claims over one connection with up to `window` confirms outstanding.

    Raises Unroutable (after every confirm is in) when any message was returned
    (mandatory: no queue bound for it) or nacked; the others stay published.
    """
    import aiormq
    import aiormq.exceptions as ae
    from pamqp.commands import Basic

    report = PublishReport()
    connection = await connect(url)
    try:
        with boundary(url, f"exchange {EXCHANGE}"):
            # on_return_raises: a mandatory message the broker returns fails its confirm
            # with PublishError instead of passing as a plain ack.
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        slots = asyncio.Semaphore(window)

        async def one(claim: Claim) -> None:
            try:
                props = aiormq.spec.Basic.Properties(
                    delivery_mode=2,  # persistent: a durable queue alone loses it on restart
                    message_id=claim.guid,
                    content_type=CONTENT_TYPE,
                    # Names this copy across redeliveries (see transport.COPY_HEADER).
                    headers={COPY_HEADER: secrets.token_hex(16)},
                )
                confirm = await channel.basic_publish(
                    claim.body,
                    exchange=EXCHANGE,
                    routing_key=ROUTING_KEY,
                    properties=props,
                    mandatory=True,
                    # Do not wait for the socket drain per message: the confirm is what
                    # proves the broker took it, and the window bounds what is queued.
                    wait=False,
                )
                if isinstance(confirm, Basic.Ack):
                    report.published += 1
                else:
                    report.nacked.append(str(claim.path))
            except ae.PublishError:
                # With two copies of one guid in flight aiormq may pin the return on the
                # other copy; either way a return is counted and the run fails.
                report.unroutable.append(str(claim.path))
            except ae.DeliveryError:
                report.nacked.append(str(claim.path))
            finally:
                slots.release()

        tasks: list[asyncio.Task[None]] = []
        with boundary(url, f"exchange {EXCHANGE}"):
            for claim in claims:
                await slots.acquire()
                tasks.append(asyncio.create_task(one(claim)))
            # Collect every task before raising, so none is left with an unread error.
            results = await asyncio.gather(*tasks, return_exceptions=True)
            failure = next((r for r in results if isinstance(r, BaseException)), None)
            if failure is not None:
                raise failure
    finally:
        await close_quietly(connection)
    if report.unroutable or report.nacked:
        bad = report.unroutable or report.nacked
        what = "returned as unroutable" if report.unroutable else "nacked by the broker"
        raise Unroutable(
            f"{len(report.unroutable) + len(report.nacked)} of {len(claims)} message(s)"
            f" {what} (first: {bad[0]}); {report.published} published"
        )
    return report
