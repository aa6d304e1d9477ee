"""What a flow does with a message besides recording it: the effect contracts.

A flow's *call* effect runs before the ledger commit (an HTTP request, a Python
function); its *SQL* effect runs inside the ledger's own transaction (the inbox
pattern), so the business rows and the dedup row commit together or not at all.

`Reject` and `Retry` are how a user's function says what happened: returning is
success, `Reject` is dead at once, `Retry` (or any other exception) is transient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class Reject(Exception):
    """The message can never succeed: dead-letter it at once."""


class Retry(Exception):
    """The message may succeed later: a transient failure."""


@dataclass(frozen=True)
class SqlEffect:
    """Business rows written in the ledger's transaction, once per message.

    `function(tx, doc)` runs for each message that takes effect, inside the open
    transaction (`tx.execute(sql, params)`); it must not commit or roll back.
    `setup` (DDL) runs once when the ledger opens. `bulk(tx, entries)` is the
    presets' one-statement-per-group form.
    """

    function: Callable[[Any, dict[str, Any]], None] | None = None
    setup: str | None = None
    bulk: Callable[[Any, list[Any]], None] | None = None
