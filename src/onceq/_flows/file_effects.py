"""A flow's effects and message spec as a flow file writes them: [http], [python],
[sql] and the spec keys, each mistake named by its key (see `flowfile_keys`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from onceq._core.effect import PythonEffect, SqlEffect, load_callable
from onceq._core.keys import Mistakes, get, str_list, toml_type
from onceq._core.message import MessageSpec
from onceq._core.redact import remember_secret
from onceq._effects.http import HttpEffect, StatusMap
from onceq._effects.http_headers import shown_name
from onceq._flows.file_keys import HTTP_KEYS, STATUS_KEYS
from onceq.errors import UsageError


def spec_of(t: dict[str, Any], m: Mistakes, where: str) -> Any:
    args: dict[str, Any] = {}
    for key in ("id_field", "group_field", "seq_field"):
        value = get(t, key, str, m, where)
        if value is not None:
            args[key] = value
    for key in ("required", "keep"):
        value = str_list(t, key, m, where)
        if value is not None:
            args[key] = value
    if (prop := get(t, "id_property", bool, m, where)) is not None:
        args["id_property"] = prop
    if (size := get(t, "max_bytes", int, m, where)) is not None:
        if size < 1:
            m.add(f"{where}.max_bytes", f"must be at least 1, not {size}")
        else:
            args["max_bytes"] = size
    try:
        return MessageSpec(**args)
    except UsageError as exc:
        m.add(*_spec_key(str(exc), where))
        return None


SPEC_KEYS = ("id_field", "group_field", "seq_field", "keep", "required", "max_bytes")


def _spec_key(message: str, where: str) -> tuple[str, str, str]:
    """MessageSpec's refusal as (the key, why, the value it is about):
    'message spec: keep 'a..b': why' → (WHERE.keep, why, "'a..b'")."""
    body = message.removeprefix("message spec: ")
    role, _, rest = body.partition(" ")
    if role.rstrip(":") not in SPEC_KEYS:
        return where, message, ""
    if role.endswith(":"):
        return f"{where}.{role[:-1]}", rest, ""
    subject, _, why = rest.rpartition(": ")
    return f"{where}.{role}", why, subject


def effect_of(t: dict[str, Any], m: Mistakes, where: str, base: Path) -> Any:
    http = get(t, "http", dict, m, where)
    python = get(t, "python", dict, m, where)
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
            return PythonEffect(fn)
    return None


def _http(t: dict[str, Any], m: Mistakes, where: str) -> Any:
    for k in t:
        if k not in HTTP_KEYS:
            m.add(f"{where}.{k}", f"unknown key (expected: {', '.join(sorted(HTTP_KEYS))})")
    url = get(t, "url", str, m, where, required=True)
    headers = get(t, "headers", dict, m, where, {})
    for hk, hv in headers.items():
        if not isinstance(hv, str):
            m.add(f"{where}.headers.{shown_name(hk)}", f"must be text, not {toml_type(hv)}")
        else:
            # A secret (its ${ENV} already in it): masked in all later output and logs.
            remember_secret(hv)
    # Named once: a value that is not text is not the effect's mistake a second time.
    headers = {k: v for k, v in headers.items() if isinstance(v, str)}
    lists: dict[str, Any] = {}
    for role in STATUS_KEYS:
        value = get(t, role, list, m, where)
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
        except UsageError as exc:  # 'duplicate: 2xx is also in success': that list's
            role = str(exc).partition(": ")[0]
            key = f"{where}.{role}" if role in STATUS_KEYS else where
            m.add(key, _after_role(str(exc), role))
    args: dict[str, Any] = {}
    for key, kind in (
        ("method", str),
        ("idempotency_header", str),
        ("timeout", (int, float)),
        ("concurrency", int),
    ):
        value = get(t, key, kind, m, where)
        if value is not None:
            args[key] = value
    if url is None:
        return None
    try:
        return HttpEffect(url, headers=headers, statuses=statuses, **args)
    except UsageError as exc:
        m.add(*_key_of(str(exc), where))
        return None


def _key_of(message: str, where: str) -> tuple[str, str, str]:
    """HttpEffect's refusal as (the key, why, the value it is about): 'header X: why' →
    (WHERE.headers.X, why, ''), 'url U: why' → (WHERE.url, why, 'U'); a flag reads
    `--url U: why`, a file `flows.NAME.http.url: U: why`."""
    if message.startswith("header "):
        name, _, why = message[len("header ") :].partition(": ")
        return f"{where}.headers.{name}", why, ""
    for head, key in (("idempotency header ", "idempotency_header"), ("url ", "url")):
        if message.startswith(head):
            subject, _, why = message[len(head) :].partition(": ")
            return f"{where}.{key}", why, subject
    for head in ("method: ", "timeout: "):
        if message.startswith(head):
            return f"{where}.{head[:-2]}", message[len(head) :], ""
    return where, message, ""


def _after_role(message: str, role: str) -> str:
    """'reject: 4x9 is not …' → '4x9 is not …': the key is already named in front."""
    for head in (f"{role}: ", f"{role} "):
        if message.startswith(head):
            return message[len(head) :]
    return message


def sql_of(t: dict[str, Any], m: Mistakes, where: str, base: Path) -> Any:
    table = get(t, "sql", dict, m, where)
    if table is None:
        return None
    w = f"{where}.sql"
    for k in table:
        if k not in ("function", "setup", "setup_postgresql"):
            m.add(f"{w}.{k}", "unknown key (expected: function, setup, setup_postgresql)")
    setup = get(table, "setup", str, m, w)
    # The DDL for a PostgreSQL ledger when SQLite's would not do (types, AUTOINCREMENT);
    # without it `setup` runs on both.
    setup_pg = get(table, "setup_postgresql", str, m, w)
    fn = _function(table, m, w, base)
    if fn is None:
        return None
    return SqlEffect(function=fn, setup=setup, setup_postgresql=setup_pg)


def _function(t: dict[str, Any], m: Mistakes, where: str, base: Path) -> Any:
    """The callable `function` names, imported with the flow file's folder first on sys.path."""
    spec = get(t, "function", str, m, where, required=True)
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
