"""What a directory-queue message is, and every way a file can fail to be one.

Each failure has its own reason, recorded in the ledger and shown in error.csv:

| reason        | the file …                                                      |
| not-a-file    | is a subfolder or a symlink (never followed out of the queue)   |
| unreadable    | may not be read by this user (replay it once its mode is fixed) |
| too-large     | is larger than the size limit (not read)                        |
| empty         | has no bytes, or only white space                               |
| encoding      | is not valid UTF-8, or a kept string holds a lone surrogate     |
| parse         | is not JSON                                                     |
| not-object    | is JSON, but not an object                                      |
| missing-field | lacks a required field (the detail names it)                    |
| bad-type      | has a field of the wrong type (seq not an integer, amount not a number …) |
|               | or a number the ledger cannot hold (outside the 64-bit range)   |

All of them are permanent: the same bytes fail the same way on every try, so the
message is quarantined at once instead of blocking the queue (the poison loop).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from onceq.consumer import Outcome
from onceq.ledger_values import fits_int64, is_utf8
from onceq.transport import Delivery, Kind

DEFAULT_REQUIRED = ("msg_id", "order_no", "seq", "amount")
DEFAULT_MAX_BYTES = 1024 * 1024

REASONS = (
    "not-a-file",
    "unreadable",
    "too-large",
    "empty",
    "encoding",
    "parse",
    "not-object",
    "missing-field",
    "bad-type",
)


@dataclass(frozen=True)
class MessageSpec:
    """Which fields a message must have. msg_id is the idempotency key, seq the sequence."""

    required: tuple[str, ...] = DEFAULT_REQUIRED
    max_bytes: int = DEFAULT_MAX_BYTES
    id_field: str = "msg_id"
    seq_field: str = "seq"


def _reject(reason: str, detail: str = "") -> Outcome:
    return Outcome(Kind.REJECTED, reason, detail)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _check_types(doc: dict[str, Any], spec: MessageSpec) -> str | None:
    """The first type problem in doc, as a detail string, or None."""
    key = doc.get(spec.id_field)
    if spec.id_field in doc and not ((isinstance(key, str) and key.strip()) or _is_int(key)):
        return f"{spec.id_field} must be a non-empty string or an integer"
    if "order_no" in doc and not (
        (isinstance(doc["order_no"], str) and doc["order_no"].strip()) or _is_int(doc["order_no"])
    ):
        return "order_no must be a non-empty string or an integer"
    if spec.seq_field in doc and not _is_int(doc[spec.seq_field]):
        return f"{spec.seq_field} must be an integer"
    if "amount" in doc and not _is_number(doc["amount"]):
        return "amount must be a finite number"
    # Valid JSON, but more than SQLite's INTEGER holds: found here, it is this message's
    # verdict; found at the commit, it would be an OverflowError for the whole group.
    for name in (spec.seq_field, "amount"):
        if _is_int(doc.get(name)) and not fits_int64(doc[name]):
            return f"{name} is outside the 64-bit integer range"
    return None


def _check_text(doc: dict[str, Any], spec: MessageSpec) -> str | None:
    """The first kept string that is not storable UTF-8 (a lone surrogate), or None.

    "\\ud800" is a legal JSON escape that decodes to a str UTF-8 cannot encode; the
    ledger would raise UnicodeEncodeError at the commit of the whole group.
    """
    for name in (spec.id_field, "order_no"):
        value = doc.get(name)
        if isinstance(value, str) and not is_utf8(value):
            return f"{name} holds a lone surrogate (\\ud800-\\udfff), not Unicode text"
    return None


def parse_document(body: bytes, spec: MessageSpec) -> dict[str, Any] | Outcome:
    """The JSON object in body, or the rejection that says why there is none."""
    if len(body) > spec.max_bytes:
        return _reject("too-large", f"{len(body)} bytes > {spec.max_bytes}")
    if not body.strip():
        return _reject("empty")
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return _reject("encoding", f"not UTF-8 at byte {exc.start}")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        return _reject("parse", f"line {exc.lineno} column {exc.colno}: {exc.msg}")
    except RecursionError:
        return _reject("parse", "nested too deeply")
    except ValueError as exc:
        # Not a JSONDecodeError, the same verdict: an integer of more than 4300 digits
        # (Python's int conversion limit) raises a plain ValueError. Uncaught, it
        # stopped the run and left the file in processing/ to stop the next run too.
        return _reject("parse", str(exc).split(";")[0][:200])
    if not isinstance(doc, dict):
        return _reject("not-object", f"top level is {type(doc).__name__}")
    return doc


def decode(delivery: Delivery, spec: MessageSpec) -> Outcome:
    """Decode a file's bytes into the fields to record, setting `delivery.msg_id`."""
    kind = delivery.headers.get("kind", "file")
    if kind == "unreadable":
        return _reject("unreadable", delivery.headers.get("detail", ""))
    if kind != "file":
        return _reject("not-a-file", kind)
    if delivery.headers.get("size", 0) > spec.max_bytes:
        return _reject("too-large", f"{delivery.headers['size']} bytes > {spec.max_bytes}")
    doc = parse_document(delivery.body, spec)
    if isinstance(doc, Outcome):
        return doc
    missing = [f for f in spec.required if f not in doc or doc[f] is None]
    if missing:
        return _reject("missing-field", ",".join(missing))
    problem = _check_types(doc, spec)
    if problem:
        return _reject("bad-type", problem)
    problem = _check_text(doc, spec)
    if problem:
        return _reject("encoding", problem)
    if spec.id_field not in doc:  # the key is needed even when a user drops it from required
        return _reject("missing-field", spec.id_field)
    delivery.msg_id = str(doc[spec.id_field])
    order_no = doc.get("order_no")
    amount = doc.get("amount")
    # The ledger's contract (issue 7): group, seq, kept (stored as JSON), doc (never stored).
    fields = {
        "group": None if order_no is None else str(order_no),
        "seq": doc.get(spec.seq_field),
        "kept": {} if amount is None else {"amount": amount},
        "doc": doc,
    }
    return Outcome(Kind.SUCCESS, fields=fields)
