"""A NATS flow's names and settings: defaults, the server URL, the checks of each name.

Checked here, before anything connects, so a mistyped stream or subject is one line
naming its key (`onceq check`, `onceq nats setup`), never a server error half-way.
"""

from __future__ import annotations

import os
import re

from onceq._core.redact import remember

__all__ = [
    "DEFAULT_ACK_WAIT",
    "DEFAULT_MAX_ACK_PENDING",
    "DEFAULT_PREFETCH",
    "DEFAULT_URL",
    "DUPLICATE_WINDOW",
    "ENV_URL",
    "dead_stream_of",
    "dead_subject_of",
    "name_problem",
    "nats_url",
    "subject_problem",
]

ENV_URL = "ONCEQ_NATS_URL"
DEFAULT_URL = "nats://127.0.0.1:4222"
# Deliveries one consumer holds at once and asks for in one pull (RabbitMQ's prefetch).
DEFAULT_PREFETCH = 5
# NATS's own default: the server redelivers a copy not acked within it. A held copy is
# kept alive by in-progress acks (onceq._sources.nats.transport), so it only bounds how
# long a crashed consumer's copies wait before another consumer gets them.
DEFAULT_ACK_WAIT = 30.0
# The durable consumer's MaxAckPending, shared by every process on it. Larger than one
# consumer's prefetch on purpose: a copy NAKed with a delay (a retry tier) keeps its
# ack-pending slot for the whole delay, so a bound equal to the prefetch would let a
# few delayed messages stop the consumer for up to the longest tier.
DEFAULT_MAX_ACK_PENDING = 1000
# The stream's duplicate window (Nats-Msg-Id de-duplication by the server); beyond it
# onceq's ledger refuses the second copy.
DUPLICATE_WINDOW = 120.0

# A stream or consumer name: no whitespace, `.`, `*`, `>`, path separators (the server
# uses them in API subjects and file names); at most 255 characters.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,255}")
_TOKEN = re.compile(r"[^\s.*>]+")


def nats_url(url: str | None = None) -> str:
    """The server URL: the argument, else ONCEQ_NATS_URL, else the local default.

    Its password (nats://user:pass@host) is masked in all later output.
    """
    url = url or os.environ.get(ENV_URL) or DEFAULT_URL
    remember(url)
    return url


def name_problem(name: object) -> str:
    """Why `name` cannot name a stream or a durable consumer, or ''."""
    if not isinstance(name, str) or not name:
        return "must be a non-empty name"
    if not _NAME.fullmatch(name):
        return f"{name!r}: letters, digits, - and _ only (at most 255)"
    return ""


def subject_problem(subject: object, wildcards: bool = True) -> str:
    """Why `subject` cannot be a subject (to publish to: no wildcards), or ''."""
    if not isinstance(subject, str) or not subject:
        return "must be a non-empty subject"
    tokens = subject.split(".")
    for i, token in enumerate(tokens):
        if token in ("*", ">"):
            if not wildcards:
                return f"{subject!r}: a wildcard cannot be published to"
            if token == ">" and i != len(tokens) - 1:
                return f"{subject!r}: '>' must be the last token"
            continue
        if not _TOKEN.fullmatch(token):
            return f"{subject!r}: an empty token or one with a space, '*' or '>'"
    return ""


def dead_subject_of(stream: str) -> str:
    """The default dead-letter subject of a stream's flow (outside any work subject)."""
    return f"onceq.dead.{stream}"


def dead_stream_of(stream: str) -> str:
    """The stream `onceq nats setup` makes for a flow's dead letters."""
    return f"{stream}_DEAD"
