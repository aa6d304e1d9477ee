"""What a message is: its id, the fields it must have, and what the ledger keeps of it.

A `MessageSpec` decodes one delivery into the fields the loop records (the contract
of issue 7, §1): `group` (str), `seq` (int), `kept` (JSON values the ledger stores)
and `doc` (the parsed object, given to effects, never stored). It sets
`delivery.msg_id`, and it never raises: a message that can never succeed gets its
reason here, at once, so it is quarantined or dead-lettered instead of retried (the
same bytes fail the same way every time: the poison loop).

Paths are dotted (`invoice.id` is `doc["invoice"]["id"]`). A key that itself holds
a dot cannot be named.

| reason        | the message …                                                    |
| not-a-file    | (directory queue) is a subfolder, a symlink or a special file    |
| unreadable    | (directory queue) may not be read by this user                   |
| too-large     | is larger than `max_bytes` (not parsed)                          |
| empty         | has no bytes, or only white space                                |
| encoding      | is not UTF-8, or a stored string holds a lone surrogate          |
| parse         | is not JSON (incl. an integer of > 4300 digits, deep nesting)    |
| not-object    | is JSON, but not an object                                       |
| missing-field | lacks a required field or the id (the detail names the path)     |
| bad-type      | has a field of the wrong type, a number outside 64 bits, or an   |
|               | id with a control character                                      |
| missing-id    | (id_property) has no usable message_id property and no id field  |
| bad-id        | (id_property) its id is not a string or an integer, or holds a   |
|               | control character                                                |

With `id_property` (RabbitMQ) the body is parsed as the claim decoder of 0.1.0 did
(every unreadable body is `parse`) and the id is looked at first; otherwise as the
directory queue did (too-large, empty, encoding, parse, not-object, then the field
checks, the id last). The two presets in `onceq._exercise.presets` are exactly those two
decoders of 0.1.0; a user's spec gets the same rules.

`types` (path → rule) is checked where the path is present (a null is a wrong type):

| rule           | the value must be …                                            |
| key            | a non-empty string or an integer                               |
| integer        | an integer within 64 bits                                      |
| number         | a finite number (an integer within 64 bits)                    |
| string         | a string                                                       |
| lenient-number | anything: kept only when a finite number within 64 bits, else dropped |

Without an entry, the id must be a non-empty string or an integer with no control
character (it may become an HTTP header, which cannot carry CR, LF or NUL); naming
the id in `types` replaces that rule (the orders preset accepts control characters,
as 0.1.0 did). The seq field is an `integer` unless `types` says otherwise. Kept
values must be storable: integers within 64 bits, finite numbers, text without lone
surrogates, at any depth.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from onceq._core.fields import ABSENT as _ABSENT
from onceq._core.fields import RULES as _RULES
from onceq._core.fields import (
    Check,
    FlatPlan,
    Kept,
    flat_kept,
    flat_plan,
    get_path,
    kept_values,
    type_problem,
)
from onceq._core.fields import FieldPath as Path
from onceq._core.fields import split_path as _split
from onceq._core.outcome import Outcome
from onceq._core.transport import REJECTED, SUCCESS, Delivery
from onceq._core.values import CONTROL_CHARS, is_utf8
from onceq.errors import UsageError, redact_text

DEFAULT_MAX_BYTES = 1024 * 1024
DETAIL_MAX = 200  # failure rows stay short: a parser's message is evidence, a page is not
TYPES = ("key", "integer", "number", "string", "lenient-number")
_BOM = codecs.BOM_UTF8
# The scanner json.loads itself ends in, called directly by the fast path (decode).
_scan_once = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set by __init__
_JSON_SPACE = " \t\n\r"  # what json.loads allows after the document


def _utf8_sig(body: bytes) -> str:
    """`body.decode("utf-8-sig")`, without the codec's Python-level wrapper (per message).

    The same text and the same UnicodeDecodeError (its positions count from after
    the BOM there too).
    """
    return (body[3:] if body.startswith(_BOM) else body).decode("utf-8")


def _reject(reason: str, detail: str = "") -> Outcome:
    return Outcome(REJECTED, reason, detail)


def _short(value: object) -> str:
    text = " ".join(str(value).split())
    return redact_text(text[:DETAIL_MAX])


@dataclass(frozen=True)
class MessageSpec:
    """Which fields a message must have, which is its id, and what the ledger keeps."""

    id_field: str | None = "msg_id"
    id_property: bool = False
    required: tuple[str, ...] = ()
    group_field: str | None = None
    seq_field: str | None = None
    keep: tuple[str, ...] = ()
    types: Mapping[str, str] = field(default_factory=dict)
    max_bytes: int = DEFAULT_MAX_BYTES
    # The plan decode follows, set by __post_init__ (not arguments, not compared).
    _id: Path | None = field(init=False, repr=False, compare=False)
    _required: list[tuple[str, Path]] = field(init=False, repr=False, compare=False)
    _checks: list[Check] = field(init=False, repr=False, compare=False)
    _keep: list[Kept] = field(init=False, repr=False, compare=False)
    _group: Path | None = field(init=False, repr=False, compare=False)
    _seq: Path | None = field(init=False, repr=False, compare=False)
    _flat: FlatPlan | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Everything the hot path needs is worked out once here: decode runs per message.
        if self.id_field is None and not self.id_property:
            raise UsageError("message spec: id_field: needed (or the message_id property)")
        if not isinstance(self.max_bytes, int) or self.max_bytes < 1:
            raise UsageError(f"message spec: max_bytes {self.max_bytes!r}: not a positive size")
        for name, rule in self.types.items():
            _split(name, "types")
            if rule not in TYPES:
                raise UsageError(f"message spec: types.{name}: {rule!r} is not one of {TYPES}")
        if self.seq_field is not None and self.types.get(self.seq_field, "integer") != "integer":
            # The ledger stores seq as an INTEGER and order-check compares it as one.
            raise UsageError(f"message spec: types.{self.seq_field}: the seq field is an integer")
        # Copies: a caller's list or dict changed later must not desync the plan below.
        object.__setattr__(self, "types", dict(self.types))
        object.__setattr__(self, "required", tuple(self.required))
        object.__setattr__(self, "keep", tuple(self.keep))
        idp = None if self.id_field is None else _split(self.id_field, "id_field")
        checks: list[tuple[str, Path, str]] = []
        if self.id_field is not None and not self.id_property:
            assert idp is not None  # split from id_field just above
            checks.append((self.id_field, idp, self.types.get(self.id_field, "id")))
        for name, rule in self.types.items():
            if name != self.id_field or self.id_property:
                checks.append((name, _split(name, "types"), rule))
        if self.seq_field is not None and self.seq_field not in self.types:
            checks.append((self.seq_field, _split(self.seq_field, "seq_field"), "integer"))
        # (name, path, rule's function, range-checked): the range of an integer is
        # looked at only after every type passed (a type problem is reported first).
        plan = [(n, p, _RULES[r], r in ("integer", "number")) for n, p, r in checks]
        keep = [(n, _split(n, "keep"), self.types.get(n) == "lenient-number") for n in self.keep]
        group = None if self.group_field is None else _split(self.group_field, "group_field")
        seq = None if self.seq_field is None else _split(self.seq_field, "seq_field")
        required = [(n, _split(n, "required")) for n in self.required]
        object.__setattr__(self, "_id", idp)
        object.__setattr__(self, "_required", required)
        object.__setattr__(self, "_checks", plan)
        object.__setattr__(self, "_keep", keep)
        object.__setattr__(self, "_group", group)
        object.__setattr__(self, "_seq", seq)
        flat = flat_plan(required, checks, keep)
        if any(p is not None and p.__class__ is not str for p in (idp, group, seq)):
            flat = None  # a dotted id, group or seq: the full path only
        object.__setattr__(self, "_flat", flat)

    def __hash__(self) -> int:
        # By value, as the generated one would, with `types` (a dict) as sorted items.
        return hash(
            (
                self.id_field,
                self.id_property,
                self.required,
                self.group_field,
                self.seq_field,
                self.keep,
                tuple(sorted(self.types.items())),
                self.max_bytes,
            )
        )

    # --- parsing --------------------------------------------------------------------

    def parse_document(self, body: bytes) -> dict[str, Any] | Outcome:
        """The JSON object in body, or the rejection that says why there is none."""
        if len(body) > self.max_bytes:
            return _reject("too-large", f"{len(body)} bytes > {self.max_bytes}")
        if self.id_property:
            try:
                doc = json.loads(_utf8_sig(body))
            except (ValueError, RecursionError) as exc:
                # ValueError covers UnicodeDecodeError, JSONDecodeError and the plain
                # ValueError of an integer over Python's 4300-digit conversion limit.
                return _reject("parse", _short(f"{type(exc).__name__}: {exc}"))
        else:
            if not body.strip():
                return _reject("empty")
            try:
                text = _utf8_sig(body)
            except UnicodeDecodeError as exc:
                return _reject("encoding", f"not UTF-8 at byte {exc.start}")
            try:
                doc = json.loads(text)
            except json.JSONDecodeError as exc:
                return _reject("parse", f"line {exc.lineno} column {exc.colno}: {exc.msg}")
            except RecursionError:
                return _reject("parse", "nested too deeply")
            except ValueError as exc:
                # Not a JSONDecodeError, the same verdict: an integer of more than 4300
                # digits raises a plain ValueError. Uncaught, it stopped the run and left
                # the file in processing/ to stop the next run too.
                return _reject("parse", str(exc).split(";")[0][:DETAIL_MAX])
        if not isinstance(doc, dict):
            return _reject("not-object", f"top level is {type(doc).__name__}")
        return doc

    # --- decoding -------------------------------------------------------------------

    def decode(self, delivery: Delivery) -> Outcome:
        """Decode one delivery into the fields to record, setting `delivery.msg_id`."""
        if self._flat is not None:
            accepted = self._accept(delivery)
            if accepted is not None:
                return accepted
        return self._decode_all(delivery)

    def _accept(self, delivery: Delivery) -> Outcome | None:
        """The fast path: `_decode_all`'s SUCCESS for a message that surely passes every
        check, or None (anything else, refusals included: `_decode_all` words them).
        An object's bytes (no BOM, no white space before it) go straight to json's own
        scanner, which json.loads calls after two Python frames and two regex matches;
        the field checks are `flat_kept`'s (onceq._core.fields)."""
        body, headers, limit = delivery.body, delivery.headers, self.max_bytes
        if headers.get("kind", "file") != "file" or headers.get("size", 0) > limit:
            return None  # (in the full path's order: a size that is no number raises alike)
        if body[:1] != b"{" or len(body) > limit:
            return None
        try:
            text = body.decode()
            doc, end = _scan_once(text, 0)
        except Exception:  # not UTF-8, not JSON, too deep…: the full path says which
            return None
        if end != len(text) and text[end:].strip(_JSON_SPACE):
            return None  # extra data after the object
        assert self._flat is not None  # only called with a flat plan
        kept = flat_kept(doc, self._flat)
        if kept is None:
            return None
        get = doc.get
        group = None
        if self._group is not None:
            value = get(self._group)
            if value is not None:
                group = str(value)
                if not group.isascii() and not is_utf8(group):
                    return None
        if self.id_property:
            prop = headers.get("message_id")
            if prop.__class__ is str and prop and not prop.isspace():
                msg_id = prop
            elif prop is not None and prop.__class__ is not str:
                return None  # not a plain text: the full path judges it
            else:  # none, or blank: the body's id
                value = None if self._id is None else get(self._id)
                if value.__class__ is int:
                    msg_id = str(value)
                elif value.__class__ is str and value and not value.isspace():
                    msg_id = value
                else:
                    return None
            if not (msg_id.isascii() and msg_id.isprintable()):
                return None  # maybe a lone surrogate or a control character
        else:
            value = get(self._id, _ABSENT)
            if value is _ABSENT:
                return None
            if value.__class__ is str and not value.isascii() and not is_utf8(value):
                return None
            msg_id = str(value)
        delivery.msg_id = msg_id
        seq = None if self._seq is None else get(self._seq)
        return Outcome(SUCCESS, fields={"group": group, "seq": seq, "kept": kept, "doc": doc})

    def _decode_all(self, delivery: Delivery) -> Outcome:
        """Every check in its order, each refusal in its words (`decode`'s full path)."""
        headers = delivery.headers
        kind = headers.get("kind", "file")
        if kind == "unreadable":
            return _reject("unreadable", headers.get("detail", ""))
        if kind != "file":
            return _reject("not-a-file", kind)
        size = headers.get("size", 0)
        if size > self.max_bytes:
            return _reject("too-large", f"{size} bytes > {self.max_bytes}")
        doc = self.parse_document(delivery.body)
        if isinstance(doc, Outcome):
            return doc
        msg_id: str | None = None
        if self.id_property:
            got = self._property_id(delivery, doc)
            if isinstance(got, Outcome):
                return got
            msg_id = got
        for _, p in self._required:
            value = doc.get(p, _ABSENT) if p.__class__ is str else get_path(doc, p)
            if value is None or value is _ABSENT:
                # Rare: only now the list of every missing field, for the detail.
                missing = [
                    n
                    for n, q in self._required
                    if (doc.get(q, _ABSENT) if q.__class__ is str else get_path(doc, q))
                    in (None, _ABSENT)
                ]
                return _reject("missing-field", ",".join(missing))
        problem = type_problem(doc, self._checks)
        if problem:
            return _reject("bad-type", problem)
        group = None
        if self._group is not None:
            value = (
                doc.get(self._group, _ABSENT)
                if self._group.__class__ is str
                else get_path(doc, self._group)
            )
            if value is not None and value is not _ABSENT:
                group = str(value)
        problem = self._check_text(doc, group)
        if problem:
            return _reject("encoding", problem)
        kept, refused = kept_values(doc, self._keep)
        if refused:
            return _reject(*refused)
        if msg_id is None:
            assert self._id is not None  # not id_property, so id_field was required
            value = (
                doc.get(self._id, _ABSENT) if self._id.__class__ is str else get_path(doc, self._id)
            )
            if value is _ABSENT:  # needed even when a user leaves it out of required
                return _reject("missing-field", self.id_field or "")
            msg_id = str(value)
        seq = None
        if self._seq is not None:
            seq = (
                doc.get(self._seq, _ABSENT)
                if self._seq.__class__ is str
                else get_path(doc, self._seq)
            )
            seq = None if seq is _ABSENT else seq
        delivery.msg_id = msg_id
        return Outcome(SUCCESS, fields={"group": group, "seq": seq, "kept": kept, "doc": doc})

    def _property_id(self, delivery: Delivery, doc: dict[str, Any]) -> str | Outcome:
        """The message_id property, else the id field (RabbitMQ's rules of 0.1.0)."""
        prop = delivery.headers.get("message_id")
        if isinstance(prop, str) and prop.strip():
            msg_id = prop
        else:  # missing, empty or blank: a publisher that set none; the body decides
            name = self.id_field
            value = (
                None
                if self._id is None
                else (
                    doc.get(self._id, _ABSENT)
                    if self._id.__class__ is str
                    else get_path(doc, self._id)
                )
            )
            if value is None or value is _ABSENT or (isinstance(value, str) and not value.strip()):
                return _reject("missing-id", f"no message_id property and no {name}")
            if isinstance(value, bool) or not isinstance(value, str | int):
                return _reject("bad-id", f"{name} is a {type(value).__name__}")
            msg_id = str(value)
        if not is_utf8(msg_id):
            return _reject("encoding", "the id is not UTF-8 text (a lone surrogate)")
        if CONTROL_CHARS.search(msg_id):
            # It becomes the Idempotency-Key header, which cannot carry CR, LF or NUL.
            return _reject("bad-id", "the id holds a control character")
        return msg_id

    def _check_text(self, doc: dict[str, Any], group: str | None) -> str | None:
        """The id or group that is not storable UTF-8 (a lone surrogate), or None.

        "\\ud800" is a legal JSON escape that decodes to a str UTF-8 cannot encode; the
        ledger would raise UnicodeEncodeError at the commit of the whole group.
        """
        if self.id_property:  # the id was checked with it; 0.1.0's claim wording
            if group is not None and not is_utf8(group):
                return f"{self.group_field} holds a lone surrogate"
            return None
        why = "holds a lone surrogate (\\ud800-\\udfff), not Unicode text"
        assert self._id is not None  # not id_property, so id_field was required
        value = doc.get(self._id, _ABSENT) if self._id.__class__ is str else get_path(doc, self._id)
        if isinstance(value, str) and not is_utf8(value):
            return f"{self.id_field} {why}"
        if group is not None and not is_utf8(group):
            return f"{self.group_field} {why}"
        return None


def decode(delivery: Delivery, spec: MessageSpec) -> Outcome:
    """`spec.decode(delivery)`: the loop's decoder for one spec."""
    return spec.decode(delivery)
