"""The rules every RabbitMQ name onceq declares follows, and the claims preset's names.

Checked before connecting (`name_problem`): on the wire a bad name is a traceback or a
closed channel half-way through a command. A user's queue names the rest through its
stem (`stem_of`), and every mistake names the option or key it came from
(`option_label` on the CLI).
"""

from __future__ import annotations

from onceq._core.values import is_utf8

# The claims preset's names (the exercise's): kept as constants for what names them.
EXCHANGE = "eai.claim"
DLX = "eai.dlx"
QUEUE = "claim.in"
DEAD_QUEUE = "claim.dead"
ROUTING_KEY = "claim"
DEAD_KEY = "claim.dead"

# AMQP 0-9-1 carries every name as a shortstr: one length byte, so 255 bytes of UTF-8.
MAX_NAME = 255
# The suffix a user's input queue usually carries; its stem names the rest.
IN_SUFFIX = ".in"
# A retry tier's name: STEM.retry.LABEL (claim.retry.5s, invoice.retry.2m).
RETRY_INFIX = ".retry."


def stem_of(queue: str) -> str:
    """The queue without a trailing ".in" ("invoice.in" → "invoice"), else the queue."""
    return queue[: -len(IN_SUFFIX)] if queue.endswith(IN_SUFFIX) and queue != IN_SUFFIX else queue


def name_problem(value: str, *, declared: bool = True, empty_ok: bool = False) -> str:
    """Why `value` cannot be an exchange, queue or routing-key name, or ''.

    Checked before connecting: on the wire a lone surrogate or a name over 255
    bytes is a traceback half-way through a command, and the broker answers an
    `amq.` name we would declare with 403 ACCESS_REFUSED, closing the channel.
    """
    if not value:
        return "" if empty_ok else "must not be empty"
    if not is_utf8(value):
        return "holds a lone surrogate (\\ud800-\\udfff), not Unicode text"
    size = len(value.encode("utf-8"))
    if size > MAX_NAME:
        return f"is {size} bytes; an AMQP name holds at most {MAX_NAME}"
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        return "holds a control character"
    if declared and value.startswith("amq."):
        return "names starting with 'amq.' are reserved by the broker"
    return ""


def option_label(field_name: str) -> str:
    """The CLI's name of a Topology field: dead_letter_queue → --dead-letter-queue."""
    return "--" + field_name.replace("_", "-")
