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

from onceq._core.values import CONTROL_CHARS, fits_int64, is_utf8
from onceq.errors import UsageError

__all__ = [
    "ABSENT",
    "PATH_TEXT",
    "RULES",
    "FieldPath",
    "Rule",
    "get_path",
    "is_int",
    "is_key",
    "is_number",
    "split_path",
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
