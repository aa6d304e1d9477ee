"""Message files → messages on a JetStream subject, each stored before it counts.

The id (the JSON's id field) travels as Nats-Msg-Id: the stream drops a second copy
of an id inside its duplicate window (the PubAck then says `duplicate`), and onceq's
ledger refuses it beyond. The files are read and checked by onceq._sources.message_files
(one rule for a message file on every broker): one unreadable, non-JSON or id-less file
publishes nothing.

Each publish is a request answered by the stream's PubAck: a message counts once the
stream stored it. Up to WINDOW requests are outstanding at once, so the socket stays
busy while the server fsyncs.
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
    import nats.errors
    import nats.js.errors as jse

    check_subject(subject)
    report = PublishReport()
    nc = await connect(url)
    try:
        js = nc.jetstream(timeout=API_TIMEOUT)
        slots = asyncio.Semaphore(window)

        async def one(message: Message) -> None:
            try:
                ack = await js.publish(subject, message.body, headers={MSG_ID: message.msg_id})
                if ack.duplicate:
                    report.duplicates.append(str(message.path))
                else:
                    report.published += 1
            except jse.NoStreamResponseError:
                report.unroutable.append(str(message.path))
            except (nats.errors.TimeoutError, jse.APIError):
                report.failed.append(str(message.path))
            finally:
                slots.release()

        tasks = []
        with boundary(url, f"subject {subject}"):
            for message in messages:
                await slots.acquire()
                tasks.append(asyncio.create_task(one(message)))
            results = await asyncio.gather(*tasks, return_exceptions=True)
            failure = next((r for r in results if isinstance(r, BaseException)), None)
            if failure is not None:
                raise failure
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
