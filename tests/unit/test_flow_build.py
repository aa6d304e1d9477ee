"""One builder for a flow file's table and the command line's flags (onceq._flows.build):
the flags become the file's keys through one table (onceq._cli.flow_flags), so a mistake
is found once and reads the same either way, named by flag or by key and line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from onceq._cli.flow_flags import FLAGS, FlagMistakes, own_flow
from onceq._core.retry import BreakerPolicy, RetryPolicy
from onceq._flows.file import FlowFileError, load_flows
from onceq._flows.file_keys import HTTP_KEYS, flow_keys
from onceq._flows.file_retry import BREAKER_KEYS, GUARD_KEYS, RETRY_KEYS
from onceq._sources import registry
from onceq._sources.dirq.plugin import DirSource
from onceq.errors import UsageError

HEAD = 'ledger = "l.db"\n[flows.inv]\nsource = "dirq"\npath = "q"\nid_field = "id"\n'
HTTP = '[flows.inv.http]\nurl = "http://127.0.0.1:9/api"\n'
URL = "http://127.0.0.1:9/api"


def _file_mistakes(tmp_path: Path, text: str) -> list[str]:
    f = tmp_path / "flows.toml"
    f.write_text(text)
    with pytest.raises(FlowFileError) as info:
        load_flows(f)
    return [line.removeprefix(f"{f}: ") for line in info.value.lines]


def _flag_mistake(**values: Any) -> str:
    with pytest.raises(UsageError) as info:
        own_flow("dirq", {"qdir": Path("/nonexistent"), "id_field": "id", **values}, {})
    return str(info.value)


def test_every_flag_sets_a_key_the_builder_reads() -> None:
    sub = {"http": HTTP_KEYS, "retry": RETRY_KEYS, "breaker": BREAKER_KEYS, "guard": GUARD_KEYS}
    for flag in FLAGS:
        head, _, rest = flag.key.partition(".")
        assert head in flow_keys(), flag
        assert not rest or rest in sub[head], flag
    assert len({f.flag for f in FLAGS}) == len({f.param for f in FLAGS}) == len(FLAGS)


def test_a_sources_flags_are_its_types_keys() -> None:
    for kind in ("dirq", "rabbitmq"):
        stype = registry.named(kind)
        assert stype is not None
        assert set(stype.flag_keys().values()) <= stype.file_keys


@pytest.mark.parametrize(
    ("toml", "flags", "key", "why"),
    [
        (
            'retry = { delays = ["5x"] }',
            {"retry_delays": "5x"},
            "retry.delays",
            '\'5x\': not a duration (e.g. "5s", "2m", "500ms")',
        ),
        (
            'breaker = { probe = "soon" }',
            {"breaker_probe": "soon"},
            "breaker.probe",
            '\'soon\': not a duration (e.g. "1s", "30s", "500ms")',
        ),
        (
            'retry = { delays = ["1m", "60s"] }',
            {"retry_delays": "1m,60s"},
            "retry.delays",
            "two delays are the same (each names its own retry queue)",
        ),
        (
            'keep = ["a..b"]',
            {"keep": "a..b"},
            "keep",
            "'a..b': not a field path (a.b.c)",
        ),
    ],
)
def test_a_mistake_reads_the_same_from_a_file_and_from_a_flag(
    tmp_path: Path, toml: str, flags: dict[str, str], key: str, why: str
) -> None:
    (line,) = _file_mistakes(tmp_path, HEAD + toml + "\n" + HTTP)
    assert line.endswith(f"flows.inv.{key}: {why}"), line
    flag = next(f.flag for f in FLAGS if f.key == key)
    said = _flag_mistake(http_url=URL, **flags)
    assert said in (f"{flag}: {why}", f"{flag} {why}"), said


def test_each_front_end_names_the_key_its_own_way() -> None:
    m = FlagMistakes("inv", "dirq")
    m.add("flow.http.headers.X-Key", "not a header name")
    m.add("flow.http.url", "a '{' or '}' that is not a {field}", "http://h/{a")
    m.add("flow.http.success", "an empty list")
    m.add("flow.workers", "must be 1-64, not 0")
    m.add("flow", "a flow name is …")
    assert m.lines == [
        "--header X-Key: not a header name",
        "--url http://h/{a: a '{' or '}' that is not a {field}",
        "--success: an empty list",
        "--workers: must be 1-64, not 0",
        "flow 'inv': a flow name is …",
    ]
    assert m.setting("flow.breaker.enabled", False) == "--no-breaker"
    assert m.setting("flow.retry.immediate") == "--immediate-retries"


def test_the_flags_collect_every_mistake_one_line_each(capsys: pytest.CaptureFixture[str]) -> None:
    said = _flag_mistake(http_url=URL, success="2x0", retry_delays="5x", breaker_probe="0")
    assert said == "--breaker-probe: '0': must be more than 0"
    assert capsys.readouterr().err.splitlines() == [
        "onceq: --success: '2x0' is not an HTTP status (100-599 or 1xx-5xx)",
        'onceq: --retry-delays: \'5x\': not a duration (e.g. "5s", "2m", "500ms")',
    ]


def test_the_flags_build_the_flow_a_table_would() -> None:
    flow = own_flow(
        "dirq",
        {
            "qdir": Path("q"),
            "workers": 3,
            "id_field": "invoiceId",
            "keep": "customer, total",
            "http_url": URL,
            "http_timeout": 2.5,
            "retry": "exercise",
            "retry_delays": "1s,1m",
            "breaker_failures": 3,
        },
        {"http.concurrency": 5},
    )
    assert flow.source == DirSource(Path("q"), 3)
    assert (flow.message.id_field, flow.message.keep) == ("invoiceId", ("customer", "total"))
    assert flow.effect.url == URL and flow.effect.timeout == 2.5
    assert flow.retry == RetryPolicy(immediate=1, delays=(1.0, 60.0))
    assert flow.breaker == BreakerPolicy(failures=3)


@pytest.mark.parametrize(
    ("toml", "says"),
    [
        (
            "breaker = { enabled = false, failures = 3 }",
            "flows.inv.breaker.failures: the breaker is off (enabled = false)",
        ),
        (
            "guard = { enabled = false, failures = 3 }",
            "flows.inv.guard.failures: the guard is off (enabled = false)",
        ),
    ],
)
def test_a_setting_of_a_switch_that_is_off_is_refused_in_a_file_too(
    tmp_path: Path, toml: str, says: str
) -> None:
    (line,) = _file_mistakes(tmp_path, HEAD + toml + "\n" + HTTP)
    assert line.endswith(says), line


def test_a_breaker_table_without_a_call_effect_says_how_to_turn_it_on(tmp_path: Path) -> None:
    (line,) = _file_mistakes(tmp_path, HEAD + "breaker = { failures = 3 }\n")
    assert line.endswith(
        "flows.inv.breaker.failures: the breaker is off (this flow has no call effect;"
        " add enabled = true)"
    ), line


@pytest.mark.parametrize(("line", "calls"), [("", 5), ("concurrency = 50\n", 50)])
def test_a_flow_files_calls_at_once_are_its_http_concurrency_not_its_prefetch(
    tmp_path: Path, line: str, calls: int
) -> None:
    # docs/deploy.md (Sizing) says so: with prefetch 50 and no http.concurrency a
    # flow makes 5 calls at once, and the partner sees 5 per host, not 50.
    f = tmp_path / "flows.toml"
    f.write_text(
        'ledger = "l.db"\n[flows.mq]\nsource = "rabbitmq"\nqueue = "q.in"\nprefetch = 50\n'
        f'id_field = "id"\n[flows.mq.http]\nurl = "{URL}"\n{line}'
    )
    (flow,) = load_flows(f).flows
    assert flow.effect.concurrency == calls
