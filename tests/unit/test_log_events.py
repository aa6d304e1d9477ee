"""Every log call of the library names its event, and every event is in one table.

An operator alerts on an event by its name (docs/operations.md lists them from
onceq._core.logs.EVENTS): a log call added without an event, or with one the table does not
describe, fails here instead of shipping a line nobody can find.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from onceq._core.logs import EVENTS as ENGINE_EVENTS
from onceq._sources.registry import log_events

# The engine's table and every source type's own (SourceType.log_events).
EVENTS = log_events()

SRC = Path(__file__).resolve().parents[2] / "src" / "onceq"
LEVELS = {"debug", "info", "warning", "error", "exception", "critical", "log"}
KEBAB = re.compile(r"^[a-z]+(-[a-z]+)*$")
# Told by onceq._core.logs itself: log_group's verdicts and the filter's default events.
FROM_LOGS = {"duplicate", "retry", "dead", "held", "recovered", "log", "python-warning"}


def _loggers(tree: ast.Module) -> set[str]:
    """Module-level names bound to logging.getLogger(...)."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            f = node.value.func
            if isinstance(f, ast.Attribute) and f.attr == "getLogger":
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _calls() -> list[tuple[Path, int, str, ast.Call]]:
    """(file, line, module, call) of every log call on a module's logger."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "_core" / "logs.py":
            continue  # log_group and say take their event as data (tested in test_logs)
        tree = ast.parse(path.read_text())
        loggers = _loggers(tree)
        module = "onceq." + ".".join(path.relative_to(SRC).with_suffix("").parts)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in LEVELS
                and _is_logger(node.func.value, loggers)
            ):
                out.append((path, node.lineno, module, node))
    return out


def _is_logger(node: ast.expr, loggers: set[str]) -> bool:
    """A module's logger (`log.warning`), or a class's own (`self.log.warning`: a base
    class whose subclasses each name their logger, as onceq._sources.feed.BrokerFeed)."""
    if isinstance(node, ast.Name):
        return node.id in loggers
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "log"
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _event(module: str, call: ast.Call) -> set[str]:
    """The event(s) a call names: a literal, or a module's *_EVENTS table looked up."""
    extra = next((k.value for k in call.keywords if k.arg == "extra"), None)
    assert isinstance(extra, ast.Dict), "no extra={...} dict literal"
    values = dict(zip(extra.keys, extra.values, strict=True))
    key = next((k for k in values if isinstance(k, ast.Constant) and k.value == "event"), None)
    assert key is not None, 'no "event" in extra'
    value = values[key]
    if isinstance(value, ast.Constant):
        return {value.value}
    tables = {n.id for n in ast.walk(value) if isinstance(n, ast.Name) and n.id.endswith("_EVENTS")}
    assert tables, f"event is neither a literal nor a *_EVENTS table: {ast.unparse(value)}"
    mod = importlib.import_module(module)
    return {v for t in tables for v in getattr(mod, t).values()}


def _say_events() -> set[str]:
    """The events of onceq._core.logs.say(text, EVENT) calls (the CLI's own lines)."""
    found = set()
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "say"
                and len(node.args) >= 2
            ):
                arg = node.args[1]
                assert isinstance(arg, ast.Constant), f"{path}: say() with a computed event"
                found.add(arg.value)
    return found


def test_the_library_has_log_calls_to_check() -> None:
    """The scan finds the known call sites (a scan that finds none would pass anything)."""
    modules = {m for _, _, m, _ in _calls()}
    for known in (
        "onceq._core.breaker",
        "onceq._sources.amqp.transport",
        "onceq._ledger.pg.reconnect",
        "onceq._core.holds",
        "onceq._sources.feed",  # self.log: a broker feed's grace warning
    ):
        assert known in modules


def test_every_log_call_names_an_event_of_the_table() -> None:
    problems = []
    for path, line, module, call in _calls():
        where = f"{path.relative_to(SRC.parent)}:{line}"
        try:
            events = _event(module, call)
        except AssertionError as exc:
            problems.append(f"{where}: {exc}")
            continue
        problems += [
            f"{where}: event {e!r} is not in onceq._core.logs.EVENTS" for e in events - set(EVENTS)
        ]
    assert not problems, "\n".join(problems)


def test_every_event_of_the_table_is_logged_somewhere_and_is_kebab_case() -> None:
    used = set(FROM_LOGS) | _say_events()
    for _, _, module, call in _calls():
        used |= _event(module, call)
    assert set(EVENTS) - used == set(), "described but never logged"
    assert [e for e in EVENTS if not KEBAB.match(e)] == []
    assert all(text.strip() for text in EVENTS.values())


def test_the_breaker_names_an_event_for_each_of_its_states() -> None:
    from onceq._core.breaker import BREAKER_EVENTS, CLOSED, HALF_OPEN, OPEN

    assert BREAKER_EVENTS == {
        OPEN: "breaker-open",
        HALF_OPEN: "breaker-half-open",
        CLOSED: "breaker-closed",
    }


def test_a_source_s_own_events_are_declared_by_its_package_not_the_engine() -> None:
    """A transport brings its events in its package (SourceType.log_events): an event
    only one source logs is that source's, and the engine's table names none of them,
    so the next transport adds no line to onceq._core.logs."""
    from onceq._sources.registry import named

    packages = {"dirq": "dirq", "amqp": "rabbitmq", "nats": "nats"}
    logged_by: dict[str, set[str]] = {}
    for _, _, module, call in _calls():
        parts = module.split(".")
        where = packages.get(parts[2]) if parts[1] == "_sources" and len(parts) > 3 else None
        for e in _event(module, call):
            logged_by.setdefault(e, set()).add(where or "engine")
    problems = []
    for kind in packages.values():
        t = named(kind)
        assert t is not None
        own = set(t.log_events)
        problems += [f"{kind}: {e} is also the engine's" for e in own & set(ENGINE_EVENTS)]
        problems += [f"{kind}: {e} is logged elsewhere too" for e in own if logged_by[e] != {kind}]
        only_here = {e for e, w in logged_by.items() if w == {kind}}
        problems += [f"{kind}: {e} is in the engine's table" for e in only_here - own]
    assert not problems, "\n".join(problems)
    assert named("nats").log_events.keys() == {"dead-letter-unstored"}  # type: ignore[union-attr]
