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

The files are read and checked first, by onceq._sources.message_files (one rule on
every broker): nothing is published unless every file is valid.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from onceq._sources.amqp.copy_header import COPY_HEADER
from onceq._sources.amqp.topology_names import EXCHANGE, ROUTING_KEY, name_problem
from onceq._sources.amqp.url import boundary, close_quietly, connect
from onceq._sources.message_files import (
    ID_FIELD,
    MAX_BODY,
    MAX_MESSAGE_ID,
    Message,
    id_problem,
    load_message,
    load_messages,
)
from onceq.errors import Unroutable, UsageError

# The names this module has always had (the claims preset's words among them).
Claim = Message
guid_problem = id_problem
__all__ = [
    "ID_FIELD",
    "MAX_BODY",
    "MAX_MESSAGE_ID",
    "WINDOW",
    "Claim",
    "Message",
    "PublishReport",
    "check_target",
    "guid_problem",
    "id_problem",
    "load_claim",
    "load_claims",
    "load_message",
    "load_messages",
    "publish",
]

# Confirms outstanding at once: enough to keep the socket busy while the broker
# fsyncs persistent messages, bounded so memory and the loss window stay small.
WINDOW = 256
CONTENT_TYPE = "application/json"


def load_claim(path: Path) -> Message:
    return load_message(path)


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
