"""A flow file (TOML): one ledger and several flows, checked whole before anything runs.

    ledger = "./ledger.db"
    [flows.invoices]
    source = "dirq"
    path = "./q"
    id_field = "invoiceId"
    [flows.invoices.http]
    url = "http://127.0.0.1:9300/api/invoices"
    headers = { Authorization = "Bearer ${INVOICE_TOKEN}" }

Every mistake is collected (not only the first), each as one line
`FILE: line N: flows.invoices.http.url: why`, so `onceq check` shows them all and a
user fixes the file in one go. Nothing is opened meanwhile: no ledger, no broker,
no queue folder is touched by a check. `${NAME}` in any string is the environment
variable (a secret stays out of the file); its value is never shown. Relative
paths are the flow file's folder's, and so is the first entry of sys.path while a
`function = "module:name"` is imported.
"""

from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceq.errors import UsageError
from onceq.redact import remember_secret

if TYPE_CHECKING:
    from onceq.flow import Flow

TOP_KEYS = {"ledger", "flows"}
FLOW_KEYS = {
    "source",
    "path",
    "workers",
    "url",
    "queue",
    "exchange",
    "routing_key",
    "dead_letter_exchange",
    "dead_letter_queue",
    "prefetch",
    "id_field",
    "id_property",
    "required",
    "group_field",
    "seq_field",
    "keep",
    "max_bytes",
    "http",
    "python",
    "sql",
}
DIRQ_ONLY = {"path", "workers"}
RABBIT_ONLY = {
    "url",
    "queue",
    "exchange",
    "routing_key",
    "dead_letter_exchange",
    "dead_letter_queue",
    "prefetch",
    "id_property",
}
HTTP_KEYS = {
    "url",
    "method",
    "headers",
    "idempotency_header",
    "success",
    "duplicate",
    "reject",
    "transient",
    "timeout",
    "concurrency",
}
STATUS_KEYS = ("success", "duplicate", "reject", "transient")
ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class FlowFileError(UsageError):
    """Every mistake in a flow file, one line each (`lines`); exit 2."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


@dataclass
class FlowFile:
    """A checked flow file: its ledger path and its flows, in the file's order."""

    path: Path
    ledger: Path
    flows: list[Flow] = field(default_factory=list)


class _Mistakes:
    """Collects `FILE: line N: key: why`; finds the line by scanning the text (best effort)."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()
        self._found: list[tuple[int, str]] = []

    @property
    def found(self) -> list[str]:
        """In the file's order (a mistake with no line last): how a reader fixes them."""
        return [text for _, text in sorted(self._found, key=lambda x: x[0])]

    def add(self, key: str, why: str) -> None:
        line = self.line_of(key)
        where = f"line {line}: " if line else ""
        self._found.append((line or 1 << 30, f"{self.path}: {where}{key}: {why}"))

    def line_of(self, key: str) -> int | None:
        """The line of `a.b.c`: its `[a.b]` table's `c =` line, else the table's header."""
        parts = key.split(".")
        for cut in range(len(parts) - 1, -1, -1):
            table, rest = parts[:cut], parts[cut:]
            start = self._table_line(table)
            if start is None:
                continue
            if not rest:
                return start + 1 if table else None
            end = self._next_table(start)
            pattern = re.compile(rf"\s*{_key_re(rest[0])}\s*(=|\.)")
            for i in range(start + 1 if table else 0, end):
                if pattern.match(self.lines[i]):
                    return i + 1
            return start + 1 if table else None
        return None

    def _table_line(self, table: list[str]) -> int | None:
        if not table:
            return -1
        pattern = re.compile(r"\s*\[\s*" + r"\s*\.\s*".join(_key_re(p) for p in table) + r"\s*\]")
        for i, text in enumerate(self.lines):
            if pattern.match(text):
                return i
        return None

    def _next_table(self, start: int) -> int:
        for i in range(start + 1, len(self.lines)):
            if self.lines[i].lstrip().startswith("["):
                return i
        return len(self.lines)


def _key_re(key: str) -> str:
    plain = re.escape(key)
    return rf"(?:{plain}|\"{plain}\"|'{plain}')"


def load_flows(path: str | Path, names: list[str] | tuple[str, ...] = ()) -> FlowFile:
    """Read and check a flow file; FlowFileError lists every mistake.

    `names` keeps only those flows (`onceq run --flow NAME`); an unknown one is a
    mistake too. Importing a `function` may run the user's module's top level.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FlowFileError([f"{path}: no such flow file"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise FlowFileError([f"{path}: cannot read: {why}"]) from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FlowFileError([f"{path}: {_toml_why(exc)}"]) from None
    m = _Mistakes(path, text)
    result = _build(doc, path.resolve().parent, m, tuple(names))
    if m.found:
        raise FlowFileError(m.found)
    result.path = path
    return result


def _toml_why(exc: tomllib.TOMLDecodeError) -> str:
    """tomllib says `why (at line N, column M)`: put the line first, as every mistake has it."""
    msg = str(exc)
    found = re.search(r"\(at line (\d+), column (\d+)\)$", msg)
    if found:
        return f"line {found[1]}: not TOML: {msg[: found.start()].strip()} (column {found[2]})"
    return f"not TOML: {msg}"


def _expand(value: Any, key: str, m: _Mistakes) -> Any:
    """`${NAME}` replaced by the environment's value, in every string, list and table."""
    import os

    if isinstance(value, str):

        def one(match: re.Match[str]) -> str:
            name = match[1]
            if name not in os.environ:
                m.add(key, f"environment variable {name} is not set")
                return ""
            return os.environ[name]

        return ENV.sub(one, value)
    if isinstance(value, list):
        return [_expand(v, key, m) for v in value]
    if isinstance(value, dict):
        return {k: _expand(v, f"{key}.{k}", m) for k, v in value.items()}
    return value


def _build(doc: dict[str, Any], base: Path, m: _Mistakes, names: tuple[str, ...]) -> FlowFile:
    for k in doc:
        if k not in TOP_KEYS:
            m.add(k, f"unknown key (expected: {', '.join(sorted(TOP_KEYS))})")
    ledger = _expand(doc.get("ledger", "ledger.db"), "ledger", m)
    if not isinstance(ledger, str) or not ledger:
        m.add("ledger", "must be a path (text)")
        ledger = "ledger.db"
    out = FlowFile(Path(), base / ledger)
    flows = doc.get("flows")
    if not isinstance(flows, dict) or not flows:
        m.add("flows", "no [flows.NAME] table: a flow file needs at least one flow")
        return out
    for name in names:
        if name not in flows:
            m.add("flows", f"no flow named {name!r} (the file has: {', '.join(flows)})")
    for name, table in flows.items():
        if names and name not in names:
            continue
        key = f"flows.{name}"
        if not isinstance(table, dict):
            m.add(key, "must be a table ([flows.NAME])")
            continue
        flow = _flow(name, _expand(table, key, m), base, m)
        if flow is not None:
            out.flows.append(flow)
    return out


def _get(
    t: dict[str, Any],
    key: str,
    kind: type | tuple[type, ...],
    m: _Mistakes,
    where: str,
    default: Any = None,
    *,
    required: bool = False,
) -> Any:
    if key not in t:
        if required:
            m.add(f"{where}.{key}", "missing: it is required")
        return default
    value = t[key]
    ok = isinstance(value, kind) and not (isinstance(value, bool) and kind in (int, (int, float)))
    if not ok:
        m.add(f"{where}.{key}", f"must be {_kind_word(kind)}, not {_toml_type(value)}")
        return default
    return value


def _kind_word(kind: type | tuple[type, ...]) -> str:
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


def _toml_type(value: Any) -> str:
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


def _str_list(t: dict[str, Any], key: str, m: _Mistakes, where: str) -> tuple[str, ...] | None:
    value = _get(t, key, list, m, where)
    if value is None:
        return None
    if not all(isinstance(v, str) and v for v in value):
        m.add(f"{where}.{key}", "must be a list of field names (text)")
        return None
    return tuple(value)


def _flow(name: str, t: dict[str, Any], base: Path, m: _Mistakes) -> Flow | None:
    from onceq.flow import NAME, DirSource, Flow, RabbitSource

    where = f"flows.{name}"
    before = len(m._found)
    if not NAME.fullmatch(name):
        m.add(where, "a flow name is 1-64 of A-Z a-z 0-9 _ . - (starting with a letter or digit)")
    for k in t:
        if k not in FLOW_KEYS:
            m.add(f"{where}.{k}", "unknown key")
    kind = _get(t, "source", str, m, where, required=True)
    source: Any = None
    if kind == "dirq":
        for k in sorted(RABBIT_ONLY & t.keys()):
            m.add(f"{where}.{k}", "is for a rabbitmq source, not a dirq one")
        path = _get(t, "path", str, m, where, required=True)
        workers = _get(t, "workers", int, m, where, 1)
        if isinstance(workers, int) and not 1 <= workers <= 64:
            m.add(f"{where}.workers", f"must be 1-64, not {workers}")
        if path:
            source = DirSource(base / path, workers)
    elif kind == "rabbitmq":
        for k in sorted(DIRQ_ONLY & t.keys()):
            m.add(f"{where}.{k}", "is for a dirq source, not a rabbitmq one")
        queue = _get(t, "queue", str, m, where, required=True)
        url = _get(t, "url", str, m, where)
        if url is not None:
            _check(m, f"{where}.url", _amqp_url, url)
        prefetch = _get(t, "prefetch", int, m, where, 5)
        if isinstance(prefetch, int) and not 1 <= prefetch <= 65535:
            m.add(f"{where}.prefetch", f"must be 1-65535, not {prefetch}")
        names = {
            k: _get(t, k, str, m, where)
            for k in sorted(RABBIT_ONLY - {"url", "queue", "prefetch", "id_property"})
        }
        if queue:
            source = RabbitSource(queue, url=url, prefetch=prefetch, **names)
            _check_names(m, where, source)
    elif kind is not None:
        m.add(f"{where}.source", f'must be "dirq" or "rabbitmq", not {kind!r}')
    spec = _spec(t, m, where)
    effect = _effect(t, m, where, base)
    sql = _sql(t, m, where, base)
    if len(m._found) > before:
        return None
    return Flow(name, source, spec, effect, sql)


def _spec(t: dict[str, Any], m: _Mistakes, where: str) -> Any:
    from onceq.message import MessageSpec

    args: dict[str, Any] = {}
    for key in ("id_field", "group_field", "seq_field"):
        value = _get(t, key, str, m, where)
        if value is not None:
            args[key] = value
    for key in ("required", "keep"):
        value = _str_list(t, key, m, where)
        if value is not None:
            args[key] = value
    if (prop := _get(t, "id_property", bool, m, where)) is not None:
        args["id_property"] = prop
    if (size := _get(t, "max_bytes", int, m, where)) is not None:
        if size < 1:
            m.add(f"{where}.max_bytes", f"must be at least 1, not {size}")
        else:
            args["max_bytes"] = size
    try:
        return MessageSpec(**args)
    except UsageError as exc:
        m.add(where, str(exc))
        return None


def _effect(t: dict[str, Any], m: _Mistakes, where: str, base: Path) -> Any:
    http = _get(t, "http", dict, m, where)
    python = _get(t, "python", dict, m, where)
    if http is not None and python is not None:
        m.add(f"{where}.python", "a flow has one call effect: [http] or [python], not both")
        return None
    if http is not None:
        return _http(http, m, f"{where}.http")
    if python is not None:
        w = f"{where}.python"
        for k in python:
            if k != "function":
                m.add(f"{w}.{k}", "unknown key (expected: function)")
        fn = _function(python, m, w, base)
        if fn is not None:
            from onceq.effect import PythonEffect

            return PythonEffect(fn)
    return None


def _http(t: dict[str, Any], m: _Mistakes, where: str) -> Any:
    from onceq.http_effect import HttpEffect, StatusMap

    for k in t:
        if k not in HTTP_KEYS:
            m.add(f"{where}.{k}", f"unknown key (expected: {', '.join(sorted(HTTP_KEYS))})")
    url = _get(t, "url", str, m, where, required=True)
    headers = _get(t, "headers", dict, m, where, {})
    for hk, hv in headers.items():
        if not isinstance(hv, str):
            m.add(f"{where}.headers.{hk}", f"must be text, not {_toml_type(hv)}")
        else:
            # A secret (its ${ENV} already in it): masked in all later output and logs.
            remember_secret(hv)
    lists: dict[str, Any] = {}
    for role in STATUS_KEYS:
        value = _get(t, role, list, m, where)
        if value is None:
            continue
        try:
            StatusMap.parse(**{role: value})
            lists[role] = value
        except UsageError as exc:
            m.add(f"{where}.{role}", _after_role(str(exc), role))
    statuses = None
    if len(lists) == sum(role in t for role in STATUS_KEYS):
        try:
            statuses = StatusMap.parse(**lists)
        except UsageError as exc:
            m.add(where, str(exc))
    args: dict[str, Any] = {}
    for key, kind in (
        ("method", str),
        ("idempotency_header", str),
        ("timeout", (int, float)),
        ("concurrency", int),
    ):
        value = _get(t, key, kind, m, where)
        if value is not None:
            args[key] = value
    if url is None:
        return None
    try:
        return HttpEffect(url, headers=headers, statuses=statuses, **args)
    except UsageError as exc:
        m.add(
            f"{where}.url" if str(exc).startswith("url ") else where, _after_role(str(exc), "url")
        )
        return None


def _after_role(message: str, role: str) -> str:
    """'reject: 4x9 is not …' → '4x9 is not …': the key is already named in front."""
    for head in (f"{role}: ", f"{role} "):
        if message.startswith(head):
            return message[len(head) :]
    return message


def _sql(t: dict[str, Any], m: _Mistakes, where: str, base: Path) -> Any:
    from onceq.effect import SqlEffect

    table = _get(t, "sql", dict, m, where)
    if table is None:
        return None
    w = f"{where}.sql"
    for k in table:
        if k not in ("function", "setup"):
            m.add(f"{w}.{k}", "unknown key (expected: function, setup)")
    setup = _get(table, "setup", str, m, w)
    fn = _function(table, m, w, base)
    if fn is None:
        return None
    return SqlEffect(function=fn, setup=setup)


def _function(t: dict[str, Any], m: _Mistakes, where: str, base: Path) -> Any:
    """The callable `function` names, imported with the flow file's folder first on sys.path."""
    from onceq.effect import load_callable

    spec = _get(t, "function", str, m, where, required=True)
    if spec is None:
        return None
    folder = str(base)
    # Kept there for the run: the user's module may import its siblings lazily.
    if not sys.path or sys.path[0] != folder:
        sys.path.insert(0, folder)
    try:
        return load_callable(spec)
    except UsageError as exc:
        m.add(f"{where}.function", str(exc))
        return None


def _check(m: _Mistakes, key: str, fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except UsageError as exc:
        m.add(key, str(exc))


def _amqp_url(url: str) -> None:
    from onceq.amqp.url import check_url

    check_url(url, "", ("amqp", "amqps"), "a broker's port")


def _check_names(m: _Mistakes, where: str, source: Any) -> None:
    """The RabbitMQ names a flow declares (`mq topology --flows`), checked as the CLI's
    options are, each mistake named by its key: found by `check`, not by the broker."""
    from onceq.amqp.topology import Topology

    for line in Topology.for_source(source).problems(lambda f: f"{where}.{f}"):
        key, _, why = line.partition(": ")
        m.add(key, why)
