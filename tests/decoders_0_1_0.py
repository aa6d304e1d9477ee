"""The two decoders of onceq 0.1.0 (commit 036b324), kept verbatim as the oracle.

tests/unit/test_message_spec.py checks that the presets (onceq._exercise.presets.ORDERS and
CLAIMS) give the same Kind, reason and detail as these for any input. Do not
"fix" anything here: this file is what 0.1.0 did.
"""

# ruff: noqa
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from onceq._core.consumer import Outcome
from onceq.errors import redact_text
from onceq._core.values import fits_int64, is_utf8
from onceq._core.transport import Delivery, Kind


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


def dirq_decode(delivery: Delivery, spec: MessageSpec) -> Outcome:
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
    fields = {
        "order_no": None if order_no is None else str(order_no),
        "seq": doc.get(spec.seq_field),
        "amount": doc.get("amount"),
    }
    return Outcome(Kind.SUCCESS, fields=fields)


CLAIMS_PATH = "/v1/claims"
DETAIL_MAX = 200  # keep failure rows short: the body of an error page is not evidence


def amqp_decode(delivery: Delivery) -> Outcome:
    """Set delivery.msg_id from the message_id property (else the body's guid).

    A body that is not a JSON object can never be accepted, so it is rejected here
    (dead-lettered at once) rather than sent to the claim system and retried. So is
    a body whose id or kept fields the ledger or an HTTP header cannot carry: any
    such failure found later would be the whole group's (a crash at the commit, a
    redelivery to every consumer), never this one message's.

    | reason     | the message …                                                  |
    | parse      | is not UTF-8 JSON (incl. an integer of > 4300 digits, deep nesting) |
    | not-object | is JSON, but not an object                                     |
    | missing-id | has no usable message_id property and no guid                  |
    | bad-id     | its guid is not a string or an integer, or an id holds a control character |
    | encoding   | its id or claimId holds a lone surrogate (legal as a JSON escape only) |
    """
    try:
        doc = json.loads(delivery.body.decode("utf-8-sig"))
    except (ValueError, RecursionError) as exc:
        # ValueError covers UnicodeDecodeError, JSONDecodeError and the plain ValueError
        # of an integer over Python's 4300-digit conversion limit.
        return Outcome(Kind.REJECTED, "parse", _short(f"{type(exc).__name__}: {exc}"))
    if not isinstance(doc, dict):
        return Outcome(Kind.REJECTED, "not-object", f"top level is {type(doc).__name__}")
    prop = delivery.headers.get("message_id")
    if isinstance(prop, str) and prop.strip():
        msg_id = prop
    else:  # missing, empty or blank: a publisher that set none; the body's guid decides
        guid = doc.get("guid")
        if guid is None or (isinstance(guid, str) and not guid.strip()):
            return Outcome(Kind.REJECTED, "missing-id", "no message_id property and no guid")
        if isinstance(guid, bool) or not isinstance(guid, str | int):
            return Outcome(Kind.REJECTED, "bad-id", f"guid is a {type(guid).__name__}")
        msg_id = str(guid)
    if not is_utf8(msg_id):
        return Outcome(Kind.REJECTED, "encoding", "the id is not UTF-8 text (a lone surrogate)")
    if CONTROL_CHARS.search(msg_id):
        # It becomes the Idempotency-Key header, which cannot carry CR, LF or NUL.
        return Outcome(Kind.REJECTED, "bad-id", "the id holds a control character")
    amount = doc.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, int | float):
        amount = None  # recorded for reports only; a claim without one is still a claim
    elif isinstance(amount, int) and not fits_int64(amount):
        amount = None  # SQLite's INTEGER would refuse it at the commit (OverflowError)
    elif isinstance(amount, float) and not math.isfinite(amount):
        amount = None  # 1e999 parses as inf; NaN would be stored as NULL anyway
    claim_id = doc.get("claimId")
    order_no = None if claim_id is None else str(claim_id)
    if order_no is not None and not is_utf8(order_no):
        return Outcome(Kind.REJECTED, "encoding", "claimId holds a lone surrogate")
    delivery.msg_id = msg_id
    return Outcome(Kind.SUCCESS, fields={"order_no": order_no, "amount": amount})


# C0 controls and DEL: not allowed in an HTTP header value (aiohttp refuses CR/LF).
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def _short(value: object) -> str:
    text = " ".join(str(value).split())
    if not text and isinstance(value, BaseException):
        text = type(value).__name__
    return redact_text(text[:DETAIL_MAX])
