"""`onceq nats setup`: create, or check, a flow's stream, dead-letter stream and consumer.

    stream S      subjects [SUBJECT], file storage, work-queue retention, duplicate window
    stream S_DEAD subjects [DEAD_SUBJECT], file storage, limits retention (kept to be read)
    consumer D    durable, pull, explicit ack, AckWait, MaxAckPending, MaxDeliver,
                  filter SUBJECT, deliver all

Work-queue retention: a copy acked (done, a duplicate, or moved to the dead letters)
leaves the stream, as a message leaves a RabbitMQ queue, so the stream's size is the
backlog. Each setting onceq relies on is compared with what exists: a stream or
consumer made by hand, or by an older setup, with another value is reported in one
line naming the setting (Conflict, exit 4) and never changed, since changing a live
consumer's settings under its running consumers is the operator's call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from onceq._sources.nats.connect import API_TIMEOUT, boundary, close_quietly, connect
from onceq._sources.nats.names import (
    DEFAULT_ACK_WAIT,
    DEFAULT_MAX_ACK_PENDING,
    DUPLICATE_WINDOW,
    dead_stream_of,
    dead_subject_of,
    name_problem,
    subject_problem,
)
from onceq.errors import Conflict, UsageError

__all__ = ["Setup", "setup"]


@dataclass(frozen=True)
class Setup:
    """What `onceq nats setup` makes for one flow."""

    stream: str
    subject: str
    durable: str
    dead_subject: str | None = None
    ack_wait: float = DEFAULT_ACK_WAIT
    max_ack_pending: int = DEFAULT_MAX_ACK_PENDING
    # -1: no bound. Attempts are the ledger's to count (a copy a stop or a drop gave
    # back untried is redelivered too); a MaxDeliver the server reaches first leaves
    # the message in the stream, never delivered again and in no dead letters.
    max_deliver: int = -1
    duplicate_window: float = DUPLICATE_WINDOW

    @property
    def dead(self) -> str:
        return self.dead_subject or dead_subject_of(self.stream)

    @property
    def dead_stream(self) -> str:
        return dead_stream_of(self.stream)

    def problems(self, label: Any = lambda k: k) -> list[str]:
        """Every mistake, one line each, named by `label(key)`."""
        out = []
        for key, why in (
            ("stream", name_problem(self.stream)),
            ("durable", name_problem(self.durable)),
            ("subject", subject_problem(self.subject)),
            ("dead_subject", subject_problem(self.dead, wildcards=False)),
        ):
            if why:
                out.append(f"{label(key)}: {why}")
        if not (isinstance(self.ack_wait, int | float) and 0 < self.ack_wait < math.inf):
            out.append(f"{label('ack_wait')}: must be more than 0 seconds")
        if not isinstance(self.max_ack_pending, int) or self.max_ack_pending < 1:
            out.append(f"{label('max_ack_pending')}: must be at least 1")
        if not isinstance(self.max_deliver, int) or self.max_deliver == 0 or self.max_deliver < -1:
            out.append(f"{label('max_deliver')}: must be -1 (no bound) or at least 1")
        if self.dead == self.subject:
            out.append(f"{label('dead_subject')}: must differ from the work subject")
        return out

    def stream_wanted(self) -> dict[str, Any]:
        return {
            "subjects": [self.subject],
            "retention": "workqueue",
            "storage": "file",
            "duplicate_window": self.duplicate_window,
        }

    def dead_wanted(self) -> dict[str, Any]:
        return {"subjects": [self.dead], "retention": "limits", "storage": "file"}

    def consumer_wanted(self) -> dict[str, Any]:
        return {
            "ack_policy": "explicit",
            "deliver_subject": None,  # a pull consumer
            "filter_subject": self.subject,
            "ack_wait": self.ack_wait,
            "max_ack_pending": self.max_ack_pending,
            "max_deliver": self.max_deliver,
        }


def _value(v: Any) -> Any:
    """An enum's value, a float of seconds rounded (the server keeps nanoseconds)."""
    v = getattr(v, "value", v)
    return round(v, 6) if isinstance(v, float) else v


def _differs(kind: str, name: str, have: Any, wanted: dict[str, Any]) -> str | None:
    for key, want in wanted.items():
        got = _value(getattr(have, key, None))
        if key == "max_deliver" and got in (None, 0):
            got = -1  # the server's "unset" is no bound
        if key == "subjects" and isinstance(got, list):
            got = sorted(got)
            want = sorted(want)
        if _value(want) != got:
            return (
                f"{kind} {name} exists with {key} {got!r}, not {want!r}; it is not changed"
                " (delete it or use another name)"
            )
    return None


async def setup(url: str, spec: Setup) -> dict[str, str]:
    """Create or check; {name: 'created' | 'exists'}; Conflict (4) on a differing setting."""
    import nats.js.errors as jse
    from nats.js import api

    problems = spec.problems()
    if problems:
        raise UsageError(problems[0])
    nc = await connect(url)
    done: dict[str, str] = {}
    try:
        js = nc.jetstream(timeout=API_TIMEOUT)
        for name, wanted in (
            (spec.stream, spec.stream_wanted()),
            (spec.dead_stream, spec.dead_wanted()),
        ):
            with boundary(url, f"stream {name}"):
                try:
                    info = await js.stream_info(name)
                except jse.NotFoundError:
                    config = api.StreamConfig(name=name, **wanted)
                    try:
                        await js.add_stream(config)
                    except jse.BadRequestError as exc:  # subjects another stream holds
                        raise Conflict(f"stream {name}: {exc.description}") from None
                    done[f"stream {name}"] = "created"
                    continue
            why = _differs("stream", name, info.config, wanted)
            if why:
                raise Conflict(why)
            done[f"stream {name}"] = "exists"
        wanted = spec.consumer_wanted()
        with boundary(url, f"consumer {spec.durable}"):
            try:
                have = await js.consumer_info(spec.stream, spec.durable)
            except jse.NotFoundError:
                consumer = api.ConsumerConfig(
                    durable_name=spec.durable,
                    name=spec.durable,
                    deliver_policy=api.DeliverPolicy.ALL,
                    ack_policy=api.AckPolicy.EXPLICIT,
                    ack_wait=spec.ack_wait,
                    max_ack_pending=spec.max_ack_pending,
                    max_deliver=spec.max_deliver,
                    filter_subject=spec.subject,
                )
                try:
                    await js.add_consumer(spec.stream, consumer)
                except jse.BadRequestError as exc:
                    raise Conflict(f"consumer {spec.durable}: {exc.description}") from None
                done[f"consumer {spec.durable}"] = "created"
                return done
        why = _differs("consumer", spec.durable, have.config, wanted)
        if why:
            raise Conflict(why)
        done[f"consumer {spec.durable}"] = "exists"
        return done
    finally:
        await close_quietly(nc)
