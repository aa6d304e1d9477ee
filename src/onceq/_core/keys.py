"""Reading a configuration mapping one key at a time, every mistake collected.

`Mistakes` collects `FILE: line N: key: why` lines instead of stopping at the first
one, so `onceq check` shows them all; `get` and `str_list` read one key with its type
checked, each wrong type a mistake naming the key and what it should have been. The
flow file's builder (onceq._flows) and each source type's section reader
(onceq._sources.*.plugin) read their keys with these, so a mistake reads the same
whichever part of a flow it is in.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from onceq.errors import UsageError

__all__ = ["Mistakes", "check", "get", "key_re", "kind_word", "str_list", "toml_type"]


class Mistakes:
    """Collects `FILE: line N: key: why`; finds the line by scanning the text (best effort)."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()
        self._found: list[tuple[int, str]] = []
        # Keys whose value named an unset ${NAME}: that is their one mistake. The value
        # left behind (the empty string in its place) is nobody's to check again, or a
        # user would read `url: : not an amqp:// URL` under the line that says why.
        self.unset: set[str] = set()

    def __len__(self) -> int:
        return len(self._found)

    @property
    def found(self) -> list[str]:
        """In the file's order (a mistake with no line last): how a reader fixes them."""
        return [text for _, text in sorted(self._found, key=lambda x: x[0])]

    def add(self, key: str, why: str, subject: str = "") -> None:
        """A mistake in `key`; `subject` is the value (or name) it is about when the
        line reads `key SUBJECT: why` on a command line (`--url U: why`): a file says
        `key: SUBJECT: why`."""
        if key in self.unset:
            return
        self.record(key, why, subject)

    def add_unset(self, key: str, name: str) -> None:
        """`${name}` in `key` is not set: one line, and no later check of that key."""
        self.record(key, f"environment variable {name} is not set", "")
        self.unset.add(key)

    def setting(self, key: str, value: Any = None) -> str:
        """How the reader writes `key` (set to `value`), for a why that names another key
        (`enabled = false`, `immediate`); a front end with other spellings (flags) says
        its own."""
        name = key.rpartition(".")[2]
        if value is None:
            return f"`{name}`"
        return f"{name} = {str(value).lower() if isinstance(value, bool) else repr(value)}"

    def record(self, key: str, why: str, subject: str) -> None:
        """Keep one mistake: here as the file's line (a front end may keep it its own way)."""
        if subject:
            why = f"{subject}: {why}"
        line = self.line_of(key)
        where = f"line {line}: " if line else ""
        self._found.append((line or 1 << 30, f"{self.path}: {where}{key}: {why}"))

    def line_of(self, key: str) -> int | None:
        """The line of `a.b.c`: its `[a.b]` table's `c =` line, else the table's header."""
        parts = key.split(".")
        for cut in range(len(parts), -1, -1):  # the key itself may be a table
            table, rest = parts[:cut], parts[cut:]
            start = self._table_line(table)
            if start is None:
                continue
            if not rest:
                return start + 1 if table else None
            end = self._next_table(start)
            pattern = re.compile(rf"\s*{key_re(rest[0])}\s*(=|\.)")
            for i in range(start + 1 if table else 0, end):
                if pattern.match(self.lines[i]):
                    return i + 1
            return start + 1 if table else None
        return None

    def _table_line(self, table: list[str]) -> int | None:
        if not table:
            return -1
        pattern = re.compile(r"\s*\[\s*" + r"\s*\.\s*".join(key_re(p) for p in table) + r"\s*\]")
        for i, text in enumerate(self.lines):
            if pattern.match(text):
                return i
        return None

    def _next_table(self, start: int) -> int:
        for i in range(start + 1, len(self.lines)):
            if self.lines[i].lstrip().startswith("["):
                return i
        return len(self.lines)


def key_re(key: str) -> str:
    plain = re.escape(key)
    return rf"(?:{plain}|\"{plain}\"|'{plain}')"


def get(
    t: dict[str, Any],
    key: str,
    kind: type | tuple[type, ...],
    m: Mistakes,
    where: str,
    default: Any = None,
    *,
    required: bool = False,
) -> Any:
    if f"{where}.{key}" in m.unset:  # already refused: neither missing nor checked
        return default
    if key not in t:
        if required:
            m.add(f"{where}.{key}", "missing: it is required")
        return default
    value = t[key]
    ok = isinstance(value, kind) and not (isinstance(value, bool) and kind in (int, (int, float)))
    if not ok:
        m.add(f"{where}.{key}", f"must be {kind_word(kind)}, not {toml_type(value)}")
        return default
    return value


def kind_word(kind: type | tuple[type, ...]) -> str:
    words = {
        str: "text",
        int: "an integer",
        bool: "true or false",
        list: "a list",
        dict: "a table",
        float: "a number",
    }
    if isinstance(kind, tuple):
        return "a number" if set(kind) == {int, float} else " or ".join(words[k] for k in kind)
    return words[kind]


def toml_type(value: Any) -> str:
    for t, word in (
        (bool, "true/false"),
        (str, "text"),
        (int, "an integer"),
        (float, "a number"),
        (list, "a list"),
        (dict, "a table"),
    ):
        if isinstance(value, t):
            return word
    return type(value).__name__


def str_list(t: dict[str, Any], key: str, m: Mistakes, where: str) -> tuple[str, ...] | None:
    value = get(t, key, list, m, where)
    if value is None:
        return None
    if not all(isinstance(v, str) and v for v in value):
        m.add(f"{where}.{key}", "must be a list of field names (text)")
        return None
    return tuple(value)


def check(m: Mistakes, key: str, fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except UsageError as exc:
        m.add(key, str(exc))
