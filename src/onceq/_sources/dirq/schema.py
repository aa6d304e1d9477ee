"""The fields of a normal message, as a CSV: `field,type,role`.

A "normal message" is a file that the consumer would process: one that decodes
successfully under the same `MessageSpec` the consumer uses (so a duplicate copy
counts, a file that would be quarantined does not). They are read from inbox/
(queued, not yet consumed) and done/ (consumed); error/ holds by construction
only files that failed, and processing/ only files in flight that will reach one
of the other folders. Before a consume the valid messages are all in inbox/,
after it they are all in done/: the schema is the same either way.

Rows are in the order the fields first appear, reading the files by name and
each object's keys in document order. `type` is the JSON type name (string,
integer, number, boolean, object, array, null); a field seen as both integer and
number is `number` (JSON does not distinguish them, JavaScript would not either);
any other mix is the type names joined by `|`, sorted, so that nothing is hidden.
`role` is `idempotency-key` for the spec's id field, `sequence` for its seq field
(any `onceq._core.message.MessageSpec`; the orders preset by default). The rows are the
top-level fields: a dotted id or seq path marks no row.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from onceq._core.message import MessageSpec
from onceq._core.transport import Delivery, Kind
from onceq._sources.dirq.files import is_message_name
from onceq._sources.dirq.orders import ORDERS
from onceq._sources.dirq.queue import DirQueue

HEADER = ("field", "type", "role")
SOURCES = ("inbox", "done")


def json_type(value: Any) -> str:
    """The JSON type name of a decoded value (bool is checked before int: it is one)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def merge_types(types: Iterable[str]) -> str:
    """One type for a field: integer + number is number; other mixes are joined by |."""
    seen = set(types)
    if {"integer", "number"} <= seen:
        seen.discard("integer")
    return "|".join(sorted(seen))


def valid_documents(queue: DirQueue, spec: MessageSpec | None = None) -> Iterator[dict[str, Any]]:
    """The decoded object of every valid message in inbox/ and done/, by file name."""
    spec = spec or ORDERS
    queue.check()
    for folder in SOURCES:
        base = queue.folder(folder)
        for name in sorted(n for n in os.listdir(base) if is_message_name(n)):
            path = base / name
            # Only regular files, never followed through a symlink: a link in the
            # inbox is quarantined by the consumer, and is not read here either.
            if path.is_symlink() or not path.is_file():
                continue
            if path.stat().st_size > spec.max_bytes:
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                with os.fdopen(fd, "rb") as f:
                    body = f.read(spec.max_bytes + 1)
            except OSError:
                # Moved by a consumer while we listed (it is read in done/), or not
                # readable: either way not a message whose fields we can know here.
                continue
            delivery = Delivery(body=body, ref=name, headers={"size": len(body)})
            out = spec.decode(delivery)
            if out.kind is Kind.SUCCESS:
                yield out.fields["doc"]


def infer(
    docs: Iterable[dict[str, Any]], spec: MessageSpec | None = None
) -> list[tuple[str, str, str]]:
    """(field, type, role) for every field that occurs in docs, in first-seen order."""
    spec = spec or ORDERS
    types: dict[str, set[str]] = {}
    for doc in docs:
        for key, value in doc.items():
            types.setdefault(key, set()).add(json_type(value))
    roles = {spec.id_field: "idempotency-key", spec.seq_field: "sequence"}
    roles.pop(None, None)
    return [(name, merge_types(t), roles.get(name, "")) for name, t in types.items()]


def render(rows: Iterable[tuple[str, str, str]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(HEADER)
    w.writerows(rows)
    return buf.getvalue()


def schema_csv(root: str | Path, spec: MessageSpec | None = None) -> str:
    """The schema CSV of the queue at root."""
    queue = DirQueue(root)
    return render(infer(valid_documents(queue, spec), spec))
