"""A flow file's retry and breaker keys (onceq._flows.file_retry): good values become the
flow's RetryPolicy/BreakerPolicy; each mistake is one `FILE: line N: key: why` line,
all of them collected; `onceq check` shows the policies each flow runs with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_support import invoke
from onceq._core.retry import BreakerPolicy, RetryPolicy
from onceq._flows.file import FlowFileError, load_flows

HEAD = """\
ledger = "ledger.db"

[flows.inv]
source = "dirq"
path = "q"
id_field = "invoiceId"
"""
HTTP = """
[flows.inv.http]
url = "http://127.0.0.1:9/api/invoices"
"""


def load(tmp_path: Path, text: str) -> tuple[RetryPolicy | None, BreakerPolicy | None]:
    f = tmp_path / "flows.toml"
    f.write_text(text)
    (flow,) = load_flows(f).flows
    return flow.retry, flow.breaker


def mistakes(tmp_path: Path, text: str) -> list[str]:
    f = tmp_path / "flows.toml"
    f.write_text(text)
    with pytest.raises(FlowFileError) as info:
        load_flows(f)
    prefix = f"{f}: "
    assert all(line.startswith(prefix) for line in info.value.lines), info.value.lines
    return [line.removeprefix(prefix) for line in info.value.lines]


def test_no_key_keeps_the_defaults(tmp_path: Path) -> None:
    assert load(tmp_path, HEAD + HTTP) == (None, None)


@pytest.mark.parametrize(
    ("keys", "policy"),
    [
        ('retry = "exercise"', RetryPolicy.exercise()),
        ('retry = "none"', RetryPolicy.none()),
        ('retry = "default"', RetryPolicy()),
        ("retry = { immediate = 2 }", RetryPolicy(immediate=2)),
        ("retry = { delays = [] }", RetryPolicy(delays=())),
        ('retry = { immediate = 0, delays = ["500ms", 2, "1.5m"] }', RetryPolicy(0, (0.5, 2, 90))),
    ],
)
def test_retry_values(tmp_path: Path, keys: str, policy: RetryPolicy) -> None:
    assert load(tmp_path, HEAD + keys + "\n" + HTTP) == (policy, None)


def test_retry_and_breaker_tables(tmp_path: Path) -> None:
    text = (
        HEAD
        + HTTP
        + '\n[flows.inv.retry]\nimmediate = 0\ndelays = ["1s", "1m"]\n'
        + '\n[flows.inv.breaker]\nfailures = 3\nprobe = "250ms"\nmax_probe = 10\n'
    )
    assert load(tmp_path, text) == (
        RetryPolicy(immediate=0, delays=(1.0, 60.0)),
        BreakerPolicy(enabled=True, failures=3, probe=0.25, max_probe=10.0),
    )


@pytest.mark.parametrize(
    ("keys", "breaker"),
    [
        ("breaker = false", BreakerPolicy.off()),
        ("breaker = true", BreakerPolicy()),
        ("breaker = { enabled = false }", BreakerPolicy.off()),
        ('breaker = { probe = "2s" }', BreakerPolicy(probe=2.0)),
    ],
)
def test_breaker_values(tmp_path: Path, keys: str, breaker: BreakerPolicy) -> None:
    assert load(tmp_path, HEAD + keys + "\n" + HTTP) == (None, breaker)


@pytest.mark.parametrize(
    ("keys", "says"),
    [
        ('retry = "often"', "line 7: flows.inv.retry: must be 'default', 'exercise', 'none'"),
        ("retry = 3", "line 7: flows.inv.retry: must be a policy's name (text) or a table, not"),
        ("retry = { tries = 3 }", "line 7: flows.inv.retry.tries: unknown key (expected:"),
        ('retry = { immediate = "1" }', "line 7: flows.inv.retry.immediate: must be an integer"),
        ("retry = { immediate = 101 }", "line 7: flows.inv.retry.immediate: must be 0-100, not"),
        ("retry = { immediate = true }", "line 7: flows.inv.retry.immediate: must be an integer"),
        ('retry = { delays = "5s" }', "line 7: flows.inv.retry.delays: must be a list, not text"),
        ('retry = { delays = ["5x"] }', "line 7: flows.inv.retry.delays: '5x': not a duration"),
        ('retry = { delays = ["0s"] }', "line 7: flows.inv.retry.delays: '0s': a delay must be"),
        ("retry = { delays = [true] }", "line 7: flows.inv.retry.delays: each delay is a duration"),
        ('retry = { delays = ["1m", "60s"] }', "line 7: flows.inv.retry.delays: two delays are"),
        ("breaker = 5", "line 7: flows.inv.breaker: must be a table or true/false, not an int"),
        ("breaker = { on = true }", "line 7: flows.inv.breaker.on: unknown key (expected:"),
        ('breaker = { enabled = "yes" }', "line 7: flows.inv.breaker.enabled: must be true or"),
        ("breaker = { failures = 0 }", "line 7: flows.inv.breaker.failures: must be 1-10000"),
        ("breaker = { failures = 2.5 }", "line 7: flows.inv.breaker.failures: must be an integer"),
        ('breaker = { probe = "soon" }', "line 7: flows.inv.breaker.probe: 'soon': not a duration"),
        ("breaker = { probe = 0 }", "line 7: flows.inv.breaker.probe: 0: must be more than 0"),
        ("breaker = { probe = [1] }", "line 7: flows.inv.breaker.probe: must be a duration"),
        (
            'breaker = { probe = "1m", max_probe = "5s" }',
            "line 7: flows.inv.breaker.max_probe: max probe must be at least the first probe",
        ),
    ],
)
def test_each_mistake_is_one_line_naming_its_key(tmp_path: Path, keys: str, says: str) -> None:
    lines = mistakes(tmp_path, HEAD + keys + "\n" + HTTP)
    assert len(lines) == 1 and lines[0].startswith(says), lines


def test_a_table_mistake_names_its_own_line_and_all_are_collected(tmp_path: Path) -> None:
    text = (
        HEAD
        + HTTP
        + '\n[flows.inv.retry]\nimmediate = -1\ndelays = ["5s", "nope"]\n'
        + "\n[flows.inv.breaker]\nfailures = 0\n"
    )
    assert mistakes(tmp_path, text) == [
        "line 12: flows.inv.retry.immediate: must be 0-100, not -1",
        'line 13: flows.inv.retry.delays: \'nope\': not a duration (e.g. "5s", "2m", "500ms")',
        "line 16: flows.inv.breaker.failures: must be 1-10000, not 0",
    ]


def test_check_shows_each_flows_policies(tmp_path: Path) -> None:
    (tmp_path / "q").mkdir()
    f = tmp_path / "flows.toml"
    f.write_text(
        HEAD
        + HTTP
        + '\n[flows.inv.retry]\ndelays = ["5s", "1m"]\n'
        + '\n[flows.plain]\nsource = "dirq"\npath = "q"\nretry = "none"\n'
    )
    r = invoke("check", str(f))
    assert r.returncode == 0, r.stderr
    assert f"{f}: flow inv: dirq -> POST http://127.0.0.1:9/api/invoices;" in r.stdout
    assert "flow inv: dirq -> POST http://127.0.0.1:9/api/invoices; retry 1 + 5s,1m, breaker" in (
        r.stdout
    )
    assert "flow plain: dirq -> ledger row; retry 0 + no delays, no breaker" in r.stdout
    r = invoke("check", str(f), "--json")
    inv, plain = json.loads(r.stdout)["flows"]
    assert inv["retry"] == {"immediate": 1, "delays": ["5s", "1m"]}
    assert inv["breaker"] == {"enabled": True, "failures": 5, "probe": "1s", "max_probe": "30s"}
    assert plain["retry"] == {"immediate": 0, "delays": []} and plain["breaker"] == {
        "enabled": False
    }
    assert not (tmp_path / "ledger.db").exists()
