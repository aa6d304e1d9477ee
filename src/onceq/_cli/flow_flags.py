"""The command line's flags as flow keys: one table, read by the one flow builder.

`dirq consume` and `mq consume` turn the flags given into the mapping a
`[flows.NAME]` table would hold (`--id-field` → `id_field`, `--url` → `http.url`,
`--retry-delays` → `retry.delays` …) and hand it to onceq._flows.build, which also
reads every flow file: a key is checked in one place. A mistake comes back by its
key and is written here with the flag that set it (`--retry-delays: '5x': not a
duration …`); the file writes the same mistake as `flows.NAME.retry.delays`. A source's
flags come from its source type (`SourceType.flag_keys`), not from this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onceq._cli.flow_options import header_pairs
from onceq._core.keys import Mistakes
from onceq._core.logs import say
from onceq._core.retry import RetryPolicy
from onceq._flows.build import build, policies
from onceq._flows.file_keys import STATUS_KEYS
from onceq._flows.file_retry import BREAKER_SETTINGS, retry_of
from onceq._flows.flow import Flow
from onceq._sources import registry
from onceq.errors import UsageError, redact_text

WHERE = "flow"  # the builder's prefix of every key a command line sets


class Refused(Exception):
    """A flag's text that is no value of its key: `--keep ',': names no field`."""

    def __init__(self, subject: str, why: str) -> None:
        super().__init__(why)
        self.subject, self.why = subject, why


def fields(text: str) -> list[str]:
    """`a,b` → ['a', 'b'] (a field list: keep, required)."""
    out = [f.strip() for f in text.split(",") if f.strip()]
    if not out:
        raise Refused(repr(text), "names no field")
    return out


def statuses(text: str) -> list[str]:
    """`200, 2xx` → ['200', '2xx']; empty: an empty list (the builder says what that means)."""
    return [p for p in (s.strip() for s in text.split(",")) if p]


def delays(text: str) -> list[str]:
    """`5s,30s` → ['5s', '30s']; `none` → [] (no delayed retry)."""
    if text.strip().lower() == "none":
        return []
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise Refused(repr(text), "an empty delay (e.g. 5s,30s,2m or none)")
    return parts


@dataclass(frozen=True)
class Flag:
    flag: str  # as a user types it
    key: str = ""  # the flow key it sets, dotted into the table (default: the flag's name)
    param: str = ""  # click's name for its value (default: the flag's name)
    read: Callable[[Any], Any] | None = None  # its text → the key's value (a list …)
    off: str = ""  # a switch's other spelling (--no-breaker)

    def __post_init__(self) -> None:
        name = self.flag.removeprefix("--").replace("-", "_")
        object.__setattr__(self, "param", self.param or name)
        object.__setattr__(self, "key", self.key or name)


# Every flag that sets a flow key, once. A flag a command lacks is simply not given.
FLAGS = (
    Flag("--id-field"),
    Flag("--group-field"),
    Flag("--seq-field"),
    Flag("--keep", read=fields),
    Flag("--required", read=fields),
    Flag("--max-bytes"),
    Flag("--url", "http.url", "http_url"),
    Flag("--method", "http.method"),
    Flag("--header", "http.headers", "headers", header_pairs),
    Flag("--idempotency-header", "http.idempotency_header"),
    *(Flag(f"--{role}", f"http.{role}", read=statuses) for role in STATUS_KEYS),
    Flag("--timeout", "http.timeout", "http_timeout"),
    Flag("--retry"),
    Flag("--immediate-retries", "retry.immediate"),
    Flag("--retry-delays", "retry.delays", read=delays),
    Flag("--breaker", "breaker.enabled", off="--no-breaker"),
    *(Flag(f"--breaker-{k.replace('_', '-')}", f"breaker.{k}") for k in BREAKER_SETTINGS),
    Flag("--guard", "guard.enabled", off="--no-guard"),
    Flag("--guard-failures", "guard.failures"),
)
BY_PARAM = {f.param: f for f in FLAGS}
BY_KEY = {f.key: f for f in FLAGS}
POLICY_PARAMS = tuple(
    f.param for f in FLAGS if f.key.split(".")[0] in ("retry", "breaker", "guard")
)
# Given as text but meaning nothing when empty, as before this table (`--method ''`).
BLANK_IS_UNSET = ("method", "idempotency_header")


class FlagMistakes(Mistakes):
    """The builder's mistakes as the flags that made them: `--url U: why`, `flow 'x': why`."""

    def __init__(self, name: str, kind: str = "") -> None:
        super().__init__(Path(), "")
        self.name = name
        source = registry.named(kind) if kind else None
        self.source_flags = {v: k for k, v in (source.flag_keys() if source else {}).items()}
        self.lines: list[str] = []

    def __len__(self) -> int:
        return len(self.lines)

    def record(self, key: str, why: str, subject: str) -> None:
        self.lines.append(self.line(key.removeprefix(WHERE).removeprefix("."), why, subject))

    def line(self, key: str, why: str, subject: str = "") -> str:
        if not key:
            return f"flow {self.name!r}: {f'{subject}: ' if subject else ''}{why}"
        flag, rest = self._flag(key)
        return f"{' '.join(x for x in (flag, rest, subject) if x)}: {why}"

    def _flag(self, key: str) -> tuple[str, str]:
        """The flag that sets `key` (or its nearest table: http.headers.X → --header X)."""
        parts = key.split(".")
        for cut in range(len(parts), 0, -1):
            head, rest = ".".join(parts[:cut]), ".".join(parts[cut:])
            if head in BY_KEY:
                return BY_KEY[head].flag, rest
            if head in self.source_flags:
                return "--" + self.source_flags[head].replace("_", "-"), rest
        return key, ""

    def setting(self, key: str, value: Any = None) -> str:
        key = key.removeprefix(WHERE).removeprefix(".")
        flag = BY_KEY.get(key)
        if flag is None:
            return self._flag(key)[0]
        if isinstance(value, bool):
            return flag.flag if value else flag.off
        return flag.flag

    def refuse(self) -> None:
        """Every mistake on stderr, one line each, the last as the UsageError (exit 2)."""
        if not self.lines:
            return
        for line in self.lines[:-1]:
            say(redact_text(line), "error")
        raise UsageError(self.lines[-1])


def _put(table: dict[str, Any], key: str, value: Any) -> None:
    *tables, last = key.split(".")
    for t in tables:
        table = table.setdefault(t, {})
    table[last] = value


def table_of(values: dict[str, Any], m: FlagMistakes, params: tuple[str, ...]) -> dict[str, Any]:
    """The flow keys the flags in `params` set (those given: None is not given)."""
    table: dict[str, Any] = {}
    for param in params:
        value = values.get(param)
        if param == "retry":
            continue  # a policy's name: below, as the base of the other retry flags
        flag = BY_PARAM[param]
        if value is None or (param in BLANK_IS_UNSET and not value):
            continue
        if flag.read is not None:
            try:
                value = flag.read(value)
            except Refused as exc:
                m.add(f"{WHERE}.{flag.key}", exc.why, exc.subject)
                continue
        _put(table, flag.key, value)
    name = values.get("retry") if "retry" in params else None
    if name is not None and "retry" in table:
        # `--retry exercise --immediate-retries 0`: the named policy, then the numbers.
        named = RetryPolicy.named(name)
        base = {"immediate": named.immediate, "delays": list(named.delays)}
        table["retry"] = {**base, **table["retry"]}
    elif name is not None:
        table["retry"] = name
    return table


def own_flow(kind: str, values: dict[str, Any], fixed: dict[str, Any]) -> Flow:
    """The flow the flags describe over a `kind` source (the command's), `fixed` the keys
    the command sets itself (its queue folder, timeout, concurrency …); exit 2 with
    every mistake, each naming its flag."""
    name = values.get("flow_name") or "default"
    m = FlagMistakes(name, kind)
    # Without --url no http flag is read (check_http_flags refused those given).
    url = bool(values.get("http_url"))
    params = tuple(p for p, f in BY_PARAM.items() if url or not f.key.startswith("http."))
    table = {"source": kind, **table_of(values, m, params)}
    stype = registry.named(kind)
    for param, key in (stype.flag_keys() if stype else {}).items():
        value = values.get(param)
        if value is not None:  # a flow file's path is text
            _put(table, key, str(value) if isinstance(value, Path) else value)
    for key, value in fixed.items():
        if key.startswith("http.") and "http" not in table:
            continue  # no call effect: its timeout and concurrency mean nothing
        _put(table, key, value)
    flow = build(name, table, WHERE, Path(), m) if not m.lines else None
    m.refuse()
    assert flow is not None  # no mistake: the builder built it
    return flow.validate()


def over_preset(flow: Flow, values: dict[str, Any]) -> Flow:
    """A preset's flow with the retry, breaker and guard flags given (the flow itself
    when none was); exit 2 naming the flag for a bad value."""
    m = FlagMistakes(flow.name)
    table = table_of(values, m, POLICY_PARAMS)
    got = policies(flow, table, WHERE, m) if not m.lines else None
    m.refuse()
    assert got is not None
    return got


def retry_policy(values: dict[str, Any]) -> RetryPolicy | None:
    """The retry policy the retry flags describe over the default one (None: none given)."""
    m = FlagMistakes("default")
    table = table_of(values, m, POLICY_PARAMS)
    policy = retry_of(table, m, WHERE, RetryPolicy()) if not m.lines else None
    m.refuse()
    return policy
