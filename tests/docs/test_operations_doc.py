"""docs/operations.md says what the code does: its alert rules are a valid Prometheus
rules file, every metric it names is one onceq registers (with the labels' values the
code gives), and its event table is onceq._sources.registry.log_events() word for word.

PyYAML is not a dependency of onceq (nor is it installed here), so the rules block is
read by a strict parser of the YAML subset a rules file needs (block mappings and
sequences, plain and quoted scalars, comments), which refuses anything else rather than
guessing: a block that passes here is read the same by any YAML parser.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from doc_examples import REPO, blocks

from onceq._core.stats import OUTCOMES
from onceq._ops.metrics import new_registry
from onceq._sources.registry import log_events

DOC = "docs/operations.md"
TEXT = (REPO / DOC).read_text()
DURATION = re.compile(r"^\d+(ms|s|m|h|d|w|y)$")


# --- a strict reader of the YAML subset ------------------------------------------------


class YamlSubsetError(ValueError):
    pass


def _scalar(text: str, where: int) -> Any:
    text = text.strip()
    if text.startswith('"'):
        if not text.endswith('"') or len(text) < 2:
            raise YamlSubsetError(f"line {where}: unclosed double quote")
        return json.loads(text)  # YAML's double-quoted escapes are JSON's for this subset
    if text.startswith("'"):
        if not text.endswith("'") or len(text) < 2:
            raise YamlSubsetError(f"line {where}: unclosed single quote")
        inner = text[1:-1]
        if re.search(r"(?<!')'(?!')", inner):
            raise YamlSubsetError(f"line {where}: a lone ' inside a single-quoted scalar")
        return inner.replace("''", "'")
    if re.match(r"^-?\d+$", text):
        return int(text)
    if text in ("true", "false"):
        return text == "true"
    # A plain scalar: none of the characters that would make YAML read something else.
    if not text or text[0] in "[]{}&*!|>%@`#,?:-\"'" or ": " in text or " #" in text:
        raise YamlSubsetError(f"line {where}: {text!r} must be quoted")
    return text


def parse_yaml_subset(source: str) -> Any:
    """The value of `source`; YamlSubsetError on anything outside the subset."""
    lines: list[tuple[int, int, str]] = []  # (line number, indent, text)
    for n, raw in enumerate(source.splitlines(), 1):
        if "\t" in raw:
            raise YamlSubsetError(f"line {n}: a tab")
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        lines.append((n, len(raw) - len(raw.lstrip(" ")), stripped))
    value, end = _block(lines, 0, lines[0][1] if lines else 0)
    if end != len(lines):
        raise YamlSubsetError(f"line {lines[end][0]}: unexpected indentation")
    return value


def _block(lines: list[tuple[int, int, str]], i: int, indent: int) -> tuple[Any, int]:
    if lines[i][2].startswith("- ") or lines[i][2] == "-":
        return _sequence(lines, i, indent)
    return _mapping(lines, i, indent)


def _sequence(lines: list[tuple[int, int, str]], i: int, indent: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    while i < len(lines) and lines[i][1] == indent:
        n, _, text = lines[i]
        if not text.startswith("- "):
            raise YamlSubsetError(f"line {n}: a mapping key among sequence items")
        rest = text[2:].strip()
        if re.match(r"^[A-Za-z_][\w.-]*:( |$)", rest):
            # "- key: value": a mapping whose first key sits after the dash.
            lines[i] = (n, indent + 2, rest)
            item, i = _mapping(lines, i, indent + 2)
        else:
            item, i = _scalar(rest, n), i + 1
        out.append(item)
    if i < len(lines) and lines[i][1] > indent:
        raise YamlSubsetError(f"line {lines[i][0]}: unexpected indentation")
    return out, i


def _mapping(lines: list[tuple[int, int, str]], i: int, indent: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    while i < len(lines) and lines[i][1] == indent:
        n, _, text = lines[i]
        m = re.match(r"^([A-Za-z_][\w.-]*):(?: (.*))?$", text)
        if not m:
            raise YamlSubsetError(f"line {n}: not `key: value`: {text!r}")
        key, rest = m.group(1), (m.group(2) or "").strip()
        if key in out:
            raise YamlSubsetError(f"line {n}: key {key!r} twice")
        if rest:
            out[key], i = _scalar(rest, n), i + 1
            continue
        i += 1
        if i >= len(lines) or lines[i][1] <= indent:
            raise YamlSubsetError(f"line {n}: {key!r} has no value")
        out[key], i = _block(lines, i, lines[i][1])
    if i < len(lines) and lines[i][1] > indent:
        raise YamlSubsetError(f"line {lines[i][0]}: unexpected indentation")
    return out, i


def test_the_subset_reader_refuses_what_it_does_not_know() -> None:
    assert parse_yaml_subset("a:\n  - b: 'x'\n    c: \"y\\n\"\n  - 3\n") == {
        "a": [{"b": "x", "c": "y\n"}, 3]
    }
    for bad in (
        "a: b: c\n",  # an unquoted ': '
        "a:\n\t- b\n",  # a tab
        "a: 1\na: 2\n",  # a key twice
        "a:\n  b: 1\n   c: 2\n",  # an indentation that belongs nowhere
        "a: {b: 1}\n",  # flow style
        "a: |\n  text\n",  # a block scalar
        "a: 'it's'\n",  # a lone quote
        "a:\n",  # no value
    ):
        with pytest.raises(YamlSubsetError):
            parse_yaml_subset(bad)


# --- the alert rules -------------------------------------------------------------------


def _rules() -> list[dict[str, Any]]:
    (block,) = [b for b in blocks(DOC) if b.lang == "yaml"]
    doc = parse_yaml_subset("\n".join(block.lines))
    assert set(doc) == {"groups"}
    (group,) = doc["groups"]
    assert set(group) == {"name", "rules"} and isinstance(group["name"], str)
    return group["rules"]


def test_the_alert_rules_are_a_prometheus_rules_file() -> None:
    rules = _rules()
    names = [r["alert"] for r in rules]
    assert len(names) == 3 == len(set(names))
    for r in rules:
        assert set(r) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}, r
        assert re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", r["alert"]), r["alert"]
        assert isinstance(r["expr"], str) and r["expr"].strip()
        assert r["expr"].count("(") == r["expr"].count(")")
        assert r["expr"].count("[") == r["expr"].count("]")
        assert r["expr"].count("{") == r["expr"].count("}")
        if "for" in r:
            assert DURATION.match(r["for"]), r["for"]
        for table in ("labels", "annotations"):
            assert all(isinstance(v, str) for v in r.get(table, {}).values()), r
        assert r["annotations"]["summary"]
    by_expr = {r["alert"]: r for r in rules}
    dead, breaker, oldest = by_expr.values()
    assert 'increase(onceq_messages_total{outcome="dead"}[15m]) > 0' in dead["expr"]
    assert breaker["expr"] == "onceq_breaker_open == 1" and breaker["for"] == "5m"
    assert oldest["expr"].startswith("onceq_oldest_message_age_seconds > ")
    # Each alert has its section: what the operator does when it fires.
    for heading in (
        "Dead letters rising",
        "Breaker open for more than 5 minutes",
        "Oldest message older than the threshold",
    ):
        assert f"### {heading}\n" in TEXT


# --- the metrics -----------------------------------------------------------------------


def _registered() -> dict[str, str]:
    """{sample name: family type} of everything onceq's registry can expose."""
    out: dict[str, str] = {}
    for family in new_registry(lambda: []).collect():
        names = {family.name}
        if family.type == "counter":
            names = {family.name + "_total"}
        elif family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_sum", "_count")}
        out.update(dict.fromkeys(names, family.type))
    return out


def test_every_metric_the_doc_names_is_registered() -> None:
    registered = _registered()
    named = set(re.findall(r"\b((?:onceq|process|python)_[a-z_]*[a-z*])\b\*?", TEXT))
    named |= {m + "*" for m in re.findall(r"\b(python_gc_)\*", TEXT)}
    assert {"onceq_messages_total", "onceq_breaker_open", "python_gc_*"} <= named
    missing = []
    for name in sorted(named):
        if name.endswith("*"):
            ok = any(r.startswith(name[:-1]) for r in registered)
        else:
            ok = name in registered
        if not ok:
            missing.append(name)
    assert not missing, f"{DOC} names metrics onceq does not register: {missing}"
    # And every onceq metric is described on the page.
    families = {n.removesuffix("_total") for n in registered if n.startswith("onceq_")}
    families = {n for n in families if not n.endswith(("_bucket", "_sum", "_count"))}
    assert {f for f in families if f not in TEXT} == set()


def _row(metric: str) -> str:
    m = re.search(rf"^\| `{metric}` \|.*$", TEXT, re.M)
    assert m, f"no table row for {metric}"
    return m.group(0)


def test_the_documented_label_values_are_the_code_s() -> None:
    from onceq._sources.dirq.scan import DIRQ_STATES

    outcomes = _row("onceq_messages_total")
    assert {w for w in OUTCOMES.values() if f"`{w}`" not in outcomes} == set()
    queue = _row("onceq_queue_messages")
    for state in (*DIRQ_STATES, "ready", "unacked", "retry", "dead"):
        assert f"`{state}`" in queue


# --- the events ------------------------------------------------------------------------


def test_the_event_table_is_onceq_logs_events() -> None:
    section = TEXT.split("### Events", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z-]+)` \| (.*) \|$", section, re.M)
    EVENTS = log_events()  # the engine's, then each source's own
    assert dict(rows) == EVENTS
    assert [k for k, _ in rows] == list(EVENTS)  # the same order: one reads like the other
