"""Message files → messages on a JetStream subject, each stored before it counts.

The id (the JSON's id field) travels as Nats-Msg-Id: the stream drops a second copy
of an id inside its duplicate window (the PubAck then says `duplicate`), and onceq's
ledger refuses it beyond. The files are read and checked by onceq._sources.message_files
(one rule for a message file on every broker): one unreadable, non-JSON or id-less file
publishes nothing.

Each publish is answered by the stream's PubAck: a message counts once the stream
stored it. Up to WINDOW are awaiting their PubAck at once, so the socket stays busy
while the server fsyncs.
"""

from __future__ import annotations

import asyncio
from typing import Any

from onceq._sources.message_files import Message
from onceq._sources.nats.connect import API_TIMEOUT, boundary, close_quietly, connect
from onceq._sources.nats.names import subject_problem
from onceq.errors import Unroutable, UsageError

WINDOW = 256
MSG_ID = "Nats-Msg-Id"


class PublishReport:
    """What a publish did: stored, dropped as duplicates, and the files no stream took."""

    def __init__(self) -> None:
        self.published = 0
        self.duplicates: list[str] = []
        self.unroutable: list[str] = []
        self.failed: list[str] = []

    def as_dict(self) -> dict[str, Any]:
        return {
            "published": self.published,
            "duplicates": self.duplicates,
            "unroutable": self.unroutable,
            "failed": self.failed,
        }


def check_subject(subject: str) -> None:
    why = subject_problem(subject, wildcards=False)
    if why:
        raise UsageError(f"--subject: {why}")


async def publish(
    url: str, messages: list[Message], subject: str, *, window: int = WINDOW
) -> PublishReport:
    """Publish every message to `subject`; Unroutable (6) when any was not stored."""
    import nats.js.errors as jse

    check_subject(subject)
    report = PublishReport()
    nc = await connect(url)
    try:
        # publish_async: a future per message answered by one shared reply
        # subscription, at most `window` outstanding (nats-py's semaphore). A request
        # per message (js.publish) cost a task, a timer and an inbox token each; so
        # would publish_async's own wait_stall (asyncio.wait_for with a timeout makes a
        # task per call): a stalled window is told by a watchdog instead, below.
        js = nc.jetstream(timeout=API_TIMEOUT, publish_async_max_pending=window)
        sent: list[tuple[Message, asyncio.Future[Any]]] = []

        async def send() -> None:
            for message in messages:
                future = await js.publish_async(
                    subject, message.body, headers={MSG_ID: message.msg_id}
                )
                sent.append((message, future))

        with boundary(url, f"subject {subject}"):
            sender = asyncio.ensure_future(send())
            answered, stalled = -1, False
            while not (await asyncio.wait({sender}, timeout=API_TIMEOUT))[0]:
                now = len(sent) - js.publish_async_pending()
                if now == answered:
                    # No PubAck for API_TIMEOUT with the window full: the stream is
                    # not answering; the rest is not sent (and counts as not stored).
                    # (nats-py turns the cancel into TooManyStalledMsgsError.)
                    stalled = True
                    sender.cancel()
                    await asyncio.gather(sender, return_exceptions=True)
                    break
                answered = now
            if not stalled:
                sender.result()  # the connection's errors, through the boundary
            report.failed.extend(str(m.path) for m in messages[len(sent) :])
            if sent:
                # Each PubAck within API_TIMEOUT of the last send; one still missing
                # then was not acknowledged (it may be stored: a re-send is a
                # duplicate for the stream inside its window, for the ledger beyond).
                await asyncio.wait([f for _, f in sent], timeout=API_TIMEOUT)
        for message, future in sent:
            if not future.done():
                future.cancel()
                report.failed.append(str(message.path))
                continue
            exc = future.exception()
            if exc is None:
                if future.result().duplicate:
                    report.duplicates.append(str(message.path))
                else:
                    report.published += 1
            elif isinstance(exc, jse.NoStreamResponseError):
                report.unroutable.append(str(message.path))
            elif isinstance(exc, jse.APIError):
                report.failed.append(str(message.path))
            else:
                with boundary(url, f"subject {subject}"):
                    raise exc
    finally:
        await close_quietly(nc)
    bad = report.unroutable + report.failed
    if bad:
        order = {str(m.path): i for i, m in reversed(list(enumerate(messages)))}
        for names in (report.unroutable, report.failed, report.duplicates):
            names.sort(key=order.__getitem__)
        parts = []
        if report.unroutable:
            parts.append(
                f"{len(report.unroutable)} taken by no stream (first: {report.unroutable[0]})"
            )
        if report.failed:
            parts.append(
                f"{len(report.failed)} not acknowledged by the stream (first: {report.failed[0]})"
            )
        exc = Unroutable(
            f"{len(bad)} of {len(messages)} message(s) to subject {subject} not stored: "
            + "; ".join(parts)
            + f"; {report.published} published"
        )
        exc.report = report  # the CLI's --json prints it
        raise exc
    first = {str(m.path): i for i, m in reversed(list(enumerate(messages)))}
    report.duplicates.sort(key=first.__getitem__)
    return report
