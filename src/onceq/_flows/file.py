"""A flow file (TOML): one ledger and several flows, checked whole before anything runs.

    ledger = "./ledger.db"           # or "postgresql://onceq:${PGPASSWORD}@db:5432/app"
    [flows.invoices]
    source = "dirq"
    path = "./q"
    id_field = "invoiceId"
    [flows.invoices.http]
    url = "http://127.0.0.1:9300/api/invoices"
    headers = { Authorization = "Bearer ${INVOICE_TOKEN}" }
    [flows.invoices.retry]           # and .breaker, .guard: onceq._flows.file_retry
    delays = ["5s", "30s"]
    [metrics]                        # optional: /metrics and /healthz (flags override)
    port = 9464
    host = "127.0.0.1"

Every mistake is collected (not only the first), each as one line
`FILE: line N: flows.invoices.http.url: why`, so `onceq check` shows them all and a
user fixes the file in one go. Nothing is opened meanwhile: no ledger, no broker,
no queue folder is touched by a check. `${NAME}` in any string is the environment
variable (a secret stays out of the file); its value is never shown. Relative
paths are the flow file's folder's (a postgresql:// ledger URL is no path: it is
taken as it is, checked, and never shown with its password), and so is the first
entry of sys.path while a `function = "module:name"` is imported.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onceq._core.keys import Mistakes, get
from onceq._flows.build import build
from onceq._flows.file_keys import ENV, METRICS_KEYS, TOP_KEYS
from onceq._flows.flow import Flow
from onceq._ledger.target import Target, as_target
from onceq.errors import UsageError


class FlowFileError(UsageError):
    """Every mistake in a flow file, one line each (`lines`); exit 2."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


@dataclass
class FlowFile:
    """A checked flow file: its ledger (a path, or a postgresql:// URL) and its flows,
    in the file's order."""

    path: Path
    ledger: Target
    flows: list[Flow] = field(default_factory=list)
    # [metrics]: where `onceq run` serves /metrics and /healthz (None: not served /
    # the default host); --metrics-port and --metrics-host override them.
    metrics_port: int | None = None
    metrics_host: str | None = None


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
    m = Mistakes(path, text)
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


def _expand(value: Any, key: str, m: Mistakes) -> Any:
    """`${NAME}` replaced by the environment's value, in every string, list and table."""
    import os

    if isinstance(value, str):

        def one(match: re.Match[str]) -> str:
            name = match[1]
            if name not in os.environ:
                m.add_unset(key, name)
                return ""
            return os.environ[name]

        return ENV.sub(one, value)
    if isinstance(value, list):
        return [_expand(v, key, m) for v in value]
    if isinstance(value, dict):
        return {k: _expand(v, f"{key}.{k}", m) for k, v in value.items()}
    return value


def _build(doc: dict[str, Any], base: Path, m: Mistakes, names: tuple[str, ...]) -> FlowFile:
    for k in doc:
        if k not in TOP_KEYS:
            m.add(k, f"unknown key (expected: {', '.join(sorted(TOP_KEYS))})")
    out = FlowFile(Path(), _ledger(doc, base, m))
    out.metrics_host, out.metrics_port = _metrics(doc, m)
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
        flow = build(name, _expand(table, key, m), key, base, m)
        if flow is not None:
            out.flows.append(flow)
    return out


def _ledger(doc: dict[str, Any], base: Path, m: Mistakes) -> Target:
    """The file's `ledger`: a path (relative to the file's folder) or a postgresql:// URL.

    A URL is checked here (parsed, never connected to), so `onceq check` names a typo
    by its key; its password (often a `${ENV}`) is masked in the line.
    """
    ledger = _expand(doc.get("ledger", "ledger.db"), "ledger", m)
    if not isinstance(ledger, str) or not ledger:
        m.add("ledger", "must be a path or a postgresql:// URL (text)")
        return base / "ledger.db"
    try:
        target = as_target(ledger, "")
    except UsageError as exc:
        m.add("ledger", str(exc).strip())
        return base / "ledger.db"
    # base / a URL would make it a path; an absolute path stays as it is.
    return target if isinstance(target, str) else base / target


def _metrics(doc: dict[str, Any], m: Mistakes) -> tuple[str | None, int | None]:
    """The file's [metrics] table: host (text) and port (1-65535), each mistake one line."""
    if "metrics" not in doc:
        return None, None
    t = doc["metrics"]
    if not isinstance(t, dict):
        m.add("metrics", "must be a table ([metrics] with host and port)")
        return None, None
    t = _expand(t, "metrics", m)
    for k in t:
        if k not in METRICS_KEYS:
            m.add(f"metrics.{k}", f"unknown key (expected: {', '.join(sorted(METRICS_KEYS))})")
    host = get(t, "host", str, m, "metrics")
    if host is not None and not host.strip():
        m.add("metrics.host", "must be an address or a host name, not empty")
        host = None
    port = get(t, "port", int, m, "metrics")
    if isinstance(port, int) and not 1 <= port <= 65535:
        m.add("metrics.port", f"must be 1-65535, not {port}")
        port = None
    return host, port
