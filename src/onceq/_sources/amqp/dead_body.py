"""A dead letter's body, shown (`onceq mq dead show ID`) and replaced by a corrected one
(`onceq mq dead replay --id ID --body FILE`).

A corrected body repairs a message; it does not make another one. So the file must be
what `onceq mq publish` would send (readable, a JSON object) and its id field must
still hold the dead letter's id: the copy keeps the dead letter's properties (its
message_id among them), and a body naming another id would be recorded in the ledger
under one id while the partner reads the other. A message with a new id is a new
message: `onceq mq publish` sends it. Every check runs before the broker is asked, so
a refused body changes nothing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onceq._sources.amqp.publisher import load_message
from onceq.errors import BadMessage, UsageError


@dataclass(frozen=True)
class NewBody:
    """The bytes a replayed copy carries instead of the dead letter's, and their file."""

    path: Path
    data: bytes

    def as_dict(self) -> dict[str, Any]:
        """How the ledger's dead_ops.filter and --json name it (the bytes themselves are
        the partner's business, not the audit's: their size and hash identify them)."""
        return {
            "file": str(self.path),
            "bytes": len(self.data),
            "sha256": hashlib.sha256(self.data).hexdigest(),
        }


def load_body(path: Path, id_field: str | None, msg_id: str) -> NewBody:
    """FILE as the corrected body of the dead letter `msg_id`.

    A missing file is NotFound (exit 3); one that is unreadable, not a JSON object, has
    no usable id or another id is BadMessage (exit 5), as `onceq mq publish` says.
    """

    if id_field is None:
        raise UsageError(
            "--body: this flow's id is the message_id property alone; there is no id field"
            " to check a corrected body against"
        )
    message = load_message(path, id_field)
    if message.msg_id != msg_id:
        raise BadMessage(
            f"{path}: {id_field} is {message.msg_id!r}, not {msg_id!r}: a corrected body"
            " keeps its message's id (a message with a new id is `onceq mq publish`)"
        )
    return NewBody(path, message.body)


def shown_body(body: bytes) -> tuple[str, bool]:
    """The body as text, and whether it is UTF-8: exactly its text when it is, else
    each byte that is not UTF-8 written as \\xNN (it cannot be printed as it is)."""
    try:
        return body.decode("utf-8"), True
    except UnicodeDecodeError:
        return body.decode("utf-8", "backslashreplace"), False
