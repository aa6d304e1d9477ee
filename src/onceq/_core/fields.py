"""A message's fields: dotted paths into a document, and the rules their values follow.

The message spec (`onceq._core.message`) checks and reads fields through these, and so
do the effects that name a field (an HTTP effect's URL placeholders) and the
publisher: one grammar of paths, one meaning of "absent", one table of `types` rules.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from onceq._core.values import CONTROL_CHARS, INT64_MAX, INT64_MIN, fits_int64, is_utf8
from onceq.errors import UsageError

__all__ = [
    "ABSENT",
    "PATH_TEXT",
    "RULES",
    "Check",
    "FieldPath",
    "FlatPlan",
    "Rule",
    "flat_kept",
    "flat_plan",
    "get_path",
    "is_int",
    "is_key",
    "is_number",
    "kept_values",
    "split_path",
    "type_problem",
    "unstorable_kept",
]

PATH_TEXT = re.compile(r"[^.\s]+(?:\.[^.\s]+)*")
ABSENT: Any = object()  # what `get_path` answers for a path the document lacks
FieldPath = str | tuple[str, ...]  # one key, or the keys of a dotted path


def split_path(path: str, role: str) -> FieldPath:
    """A checked path: a str for a top-level key (the hot path's dict.get), else a tuple."""
    if not isinstance(path, str) or not PATH_TEXT.fullmatch(path):
        raise UsageError(f"message spec: {role} {path!r}: not a field path (a.b.c)")
    parts = tuple(path.split("."))
    return parts[0] if len(parts) == 1 else parts


def get_path(doc: Any, path: FieldPath) -> Any:
    """The value at `path` in doc, or `ABSENT` (an intermediate that is not an object too)."""
    if path.__class__ is str:
        return doc.get(path, ABSENT)
    value = doc
    for key in path:
        if type(value) is not dict:  # json.loads makes dicts only; a list is no object
            return ABSENT
        value = value.get(key, ABSENT)
        if value is ABSENT:
            return ABSENT
    return value


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return (is_int(v) or isinstance(v, float)) and math.isfinite(v)


def is_key(v: Any) -> bool:
    return (isinstance(v, str) and bool(v.strip())) or is_int(v)


def unstorable_kept(value: Any) -> str | None:
    """Why a kept JSON value cannot be stored (int64, finite, UTF-8 at any depth), or None.

    A walk with a stack, not recursion: a value nested as deeply as json.loads allows
    would otherwise raise RecursionError here, with the loop's frames on top.
    """
    cls = value.__class__
    # The usual kept value is one scalar: judged here, without the walk's list.
    if cls is float:
        return None if math.isfinite(value) else "must be a finite number"
    if cls is str:
        return None if is_utf8(value) else "holds a lone surrogate"
    if cls is int:
        return None if fits_int64(value) else "is outside the 64-bit integer range"
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, int):
            if not fits_int64(v):
                return "is outside the 64-bit integer range"
        elif isinstance(v, float):
            if not math.isfinite(v):
                return "must be a finite number"
        elif isinstance(v, str):
            if not is_utf8(v):
                return "holds a lone surrogate"
        elif isinstance(v, dict):
            for k in v:
                if isinstance(k, str) and not is_utf8(k):
                    return "holds a lone surrogate"
            stack.extend(v.values())
        else:
            stack.extend(v)
    return None


# One function per `types` rule: the first problem of `value` under it, or None. The
# spec resolves each rule to its function once, so decode does no lookup by name.
def _bad_id(name: str, value: Any) -> str | None:
    if not is_key(value):
        return f"{name} must be a non-empty string or an integer"
    if isinstance(value, str) and CONTROL_CHARS.search(value):
        return f"{name} holds a control character"
    return None


def _bad_key(name: str, value: Any) -> str | None:
    return None if is_key(value) else f"{name} must be a non-empty string or an integer"


def _bad_integer(name: str, value: Any) -> str | None:
    return None if is_int(value) else f"{name} must be an integer"


def _bad_number(name: str, value: Any) -> str | None:
    return None if is_number(value) else f"{name} must be a finite number"


def _bad_string(name: str, value: Any) -> str | None:
    return None if isinstance(value, str) else f"{name} must be a string"


def _any(name: str, value: Any) -> str | None:
    return None


Rule = Callable[[str, Any], str | None]  # a field's name and value → its problem, or None

RULES: dict[str, Rule] = {
    "id": _bad_id,
    "key": _bad_key,
    "integer": _bad_integer,
    "number": _bad_number,
    "string": _bad_string,
    "lenient-number": _any,
}


# (name, path, rule's function, range-checked) per check; (name, path, lenient) per kept
Check = tuple[str, FieldPath, Rule, bool]
Kept = tuple[str, FieldPath, bool]


def type_problem(doc: dict[str, Any], checks: list[Check]) -> str | None:
    """The first type problem, as a detail string, or None (types, then ranges)."""
    out_of_range = None
    for name, path, bad, ranged in checks:
        value = doc.get(path, ABSENT) if path.__class__ is str else get_path(doc, path)
        if value is ABSENT:
            continue
        problem = bad(name, value)
        if problem:
            return problem
        # Valid JSON, but more than SQLite's INTEGER holds: found here, it is this
        # message's verdict; found at the commit, an OverflowError for the whole
        # group. Reported after every type check, in the order of the checks.
        if (
            ranged
            and out_of_range is None
            and value.__class__ is int
            and not INT64_MIN <= value <= INT64_MAX
        ):
            out_of_range = f"{name} is outside the 64-bit integer range"
    return out_of_range


def kept_values(
    doc: dict[str, Any], keep: list[Kept]
) -> tuple[dict[str, Any], tuple[str, str] | None]:
    """The kept values by path (absent ones left out), or a refusal (reason, detail)."""
    kept: dict[str, Any] = {}
    for name, path, lenient in keep:
        value = doc.get(path, ABSENT) if path.__class__ is str else get_path(doc, path)
        if value is ABSENT:
            continue
        if lenient:
            # Recorded for reports only (the claims preset's amount): a message
            # without a usable one is still a message.
            if is_number(value) and (not isinstance(value, int) or fits_int64(value)):
                kept[name] = value
            continue
        why = unstorable_kept(value)
        if why:
            reason = "encoding" if "surrogate" in why else "bad-type"
            return kept, (reason, f"{name} {why}")
        kept[name] = value
    return kept, None


# --- the fast acceptance ------------------------------------------------------------
#
# Nearly every message passes every check. `flat_kept` says so for a spec whose paths
# are all top-level keys, in one function with no call per rule (decode runs per
# message): it answers the kept values when every check surely passes, and None for
# anything else — a refusal, but also anything merely unusual (a non-ASCII text, an
# integer outside 64 bits). None sends the message down the spec's full path, which
# alone words refusals; so the fast path can only ever say yes where the full path
# says yes, with the same values (tests/unit/test_message_fast.py holds them equal).
_CODES = {"id": 0, "key": 1, "integer": 2, "number": 3, "string": 4, "lenient-number": 5}
_ID, _KEY, _INTEGER, _NUMBER, _STRING, _LENIENT = range(6)
_isfinite = math.isfinite

# (required keys, (key, rule code) per check, (key, lenient) per kept key)
FlatPlan = tuple[tuple[str, ...], tuple[tuple[str, int], ...], tuple[tuple[str, bool], ...]]


def flat_plan(
    required: list[tuple[str, FieldPath]],
    checks: list[tuple[str, FieldPath, str]],
    keep: list[Kept],
) -> FlatPlan | None:
    """The plan of `flat_kept`, or None when a path is dotted (the full path only)."""
    paths = [p for _, p in required] + [p for _, p, _ in checks] + [p for _, p, _ in keep]
    if any(p.__class__ is not str for p in paths):
        return None
    return (
        tuple(str(p) for _, p in required),
        tuple((str(p), _CODES[rule]) for _, p, rule in checks),
        tuple((str(p), lenient) for _, p, lenient in keep),
    )


def flat_kept(doc: dict[str, Any], plan: FlatPlan) -> dict[str, Any] | None:
    """The kept values when every required field, `types` rule and kept value surely
    passes (the full path's checks, in their own words: see `RULES`, `unstorable_kept`),
    else None."""
    get = doc.get
    required, checks, keep = plan
    for key in required:
        if get(key) is None:  # absent or null: missing-field
            return None
    for key, code in checks:
        v = get(key, ABSENT)
        if v is ABSENT:
            continue
        c = v.__class__
        if c is str:
            if code >= _STRING:
                continue
            # id and key: a non-blank text (v.strip() non-empty); the id also without
            # a control character, which every printable text is sure to be.
            if code <= _KEY and v and not v.isspace() and (code == _KEY or v.isprintable()):
                continue
            return None
        if c is int:  # never a bool: its class is bool
            if code == _STRING:
                return None
            if (code in (_INTEGER, _NUMBER)) and not INT64_MIN <= v <= INT64_MAX:
                return None  # out of range (or, for number, maybe not even a float)
            continue
        if c is float and ((code == _NUMBER and _isfinite(v)) or code == _LENIENT):
            continue
        if code != _LENIENT:  # null, bool, object, list, or a float where none goes
            return None
    kept: dict[str, Any] = {}
    for key, lenient in keep:
        v = get(key, ABSENT)
        if v is ABSENT:
            continue
        c = v.__class__
        if c is float:
            ok = _isfinite(v)
            if lenient and not ok:
                continue  # lenient: not kept, still a message
        elif c is int:
            ok = INT64_MIN <= v <= INT64_MAX
        elif lenient:
            continue  # text, null, bool, object, list: not a number, not kept
        elif c is str:
            ok = v.isascii() or is_utf8(v)
        else:
            ok = unstorable_kept(v) is None
        if not ok:
            return None  # a refusal, or a lenient integer beyond a float: the full path
        kept[key] = v
    return kept
