"""A delivery whose properties are not UTF-8 must reach the loop, not kill the connection.

AMQP's shortstr (message_id, correlation_id, type, app_id …) is bytes on the wire;
pamqp decodes it as strict UTF-8. A publisher that sends other bytes (pika accepts
`message_id=b"\\xff"`) makes that decode raise inside aiormq's frame reader: the
connection drops (InvalidFrameError), the robust connection reconnects, the broker
redelivers the same message first, and the consumer loops on it for ever while every
message behind it waits. One hostile message stops the queue.

`tolerate_non_utf8_shortstr` makes the shortstr decoder fall back to surrogateescape
for such bytes only (valid UTF-8 decodes exactly as before). The delivery then
reaches the decoder, which refuses the id (`encoding`: it is not text, and not
storable) and the loop dead-letters it with its reason. A header-table key that is
not UTF-8 is decoded by pamqp inline and still breaks the connection (not fixed here).
"""

from __future__ import annotations

from typing import Any

_installed = False


def tolerate_non_utf8_shortstr() -> None:
    """Install the tolerant shortstr decoder into pamqp (idempotent)."""
    global _installed
    if _installed:
        return
    from pamqp import decode

    strict = decode.short_str

    def short_str(value: bytes) -> tuple[int, str]:
        try:
            return strict(value)
        except UnicodeDecodeError:
            length = value[0]
            return length + 1, value[1 : length + 1].decode("utf-8", "surrogateescape")

    tolerant: Any = short_str
    decode.short_str = tolerant
    decode.METHODS["shortstr"] = tolerant
    _installed = True
