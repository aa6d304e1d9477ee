"""The retry and breaker flags (onceq._cli.retry_options): what each flag changes, that a
flow keeps its own policy when no flag is given, and each mistake as one line naming
the flag (exit 2 through the real `onceq` error mapping)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from onceq._cli.retry_options import apply_retry, retry_from_values, retry_options
from onceq._core.retry import BreakerPolicy, RetryPolicy
from onceq._exercise.orders import orders_flow
from onceq._flows.flow import Flow
from onceq._sources.dirq.plugin import DirSource
from onceq.errors import UsageError


def _parse(*args: str, breaker: bool = True) -> dict[str, Any]:
    """The kwargs click hands a command decorated with retry_options."""
    seen: dict[str, Any] = {}

    @click.command()
    @retry_options(breaker=breaker)
    def cmd(**values: Any) -> None:
        seen.update(values)

    result = CliRunner().invoke(cmd, list(args), standalone_mode=False, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return seen


def _call_flow() -> Flow:
    return Flow("f", DirSource(Path("/nonexistent")), effect=lambda doc: None)


def test_kwarg_names_are_the_designs() -> None:
    assert set(_parse()) == {
        "retry",
        "immediate_retries",
        "retry_delays",
        "breaker",
        "breaker_failures",
        "breaker_probe",
        "breaker_max_probe",
        "guard",
        "guard_failures",
    }
    assert set(_parse(breaker=False)) == {"retry", "immediate_retries", "retry_delays"}
    assert all(v is None for v in _parse().values())  # "not given" is None, never a default


def test_no_flag_leaves_the_flow_alone_and_pops_every_key() -> None:
    flow = orders_flow("/nonexistent")
    values = _parse()
    values["other"] = 1
    assert apply_retry(flow, values) is flow
    assert values == {"other": 1}
    assert flow.retry == RetryPolicy.none() and flow.breaker == BreakerPolicy.off()


def test_retry_names_a_base_policy() -> None:
    f = _call_flow()
    assert apply_retry(f, _parse("--retry", "exercise")).retry == RetryPolicy.exercise()
    assert apply_retry(f, _parse("--retry", "none")).retry == RetryPolicy.none()
    assert apply_retry(f, _parse("--retry", "default")).retry == RetryPolicy()
    assert f.retry is None  # a copy: the flow given is not changed


def test_immediate_and_delays_change_the_flows_policy() -> None:
    got = apply_retry(_call_flow(), _parse("--immediate-retries", "3", "--retry-delays", "1s,2m"))
    assert got.retry == RetryPolicy(immediate=3, delays=(1.0, 120.0))
    # over the preset's own policy (none), not over the default
    got = apply_retry(orders_flow("/x"), _parse("--retry-delays", "500ms"))
    assert got.retry == RetryPolicy(immediate=0, delays=(0.5,))
    got = apply_retry(_call_flow(), _parse("--retry", "exercise", "--immediate-retries", "0"))
    assert got.retry == RetryPolicy(immediate=0, delays=())


def test_retry_delays_none_means_no_tiers() -> None:
    got = apply_retry(_call_flow(), _parse("--retry-delays", "none"))
    assert got.retry == RetryPolicy(immediate=1, delays=())


def test_breaker_flags() -> None:
    f = _call_flow()
    assert apply_retry(f, _parse("--no-breaker")).breaker == BreakerPolicy.off()
    got = apply_retry(
        f,
        _parse("--breaker-failures", "3", "--breaker-probe", "200ms", "--breaker-max-probe", "1m"),
    ).breaker
    assert got == BreakerPolicy(enabled=True, failures=3, probe=0.2, max_probe=60.0)
    # a flow without a call effect has the breaker off; --breaker turns it on
    assert apply_retry(orders_flow("/x"), _parse("--breaker")).breaker == BreakerPolicy()


def test_retry_from_values_is_the_topology_policy() -> None:
    assert retry_from_values(_parse(breaker=False)) is None
    values = _parse("--retry", "exercise", breaker=False)
    assert retry_from_values(values) == RetryPolicy.exercise()
    assert values == {}
    assert retry_from_values(_parse("--retry-delays", "1s,1m")) == RetryPolicy(delays=(1.0, 60.0))


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--retry-delays", "5s,,30s"], "--retry-delays '5s,,30s': an empty delay"),
        (["--retry-delays", ""], "--retry-delays '': an empty delay"),
        (["--retry-delays", "5x"], "--retry-delays: '5x': not a duration"),
        (["--retry-delays", "0s"], "--retry-delays: '0s': a delay must be more than 0"),
        (["--retry-delays", "60s,1m"], "--retry-delays: two delays are the same"),
        (["--retry-delays", ",".join(f"{i}s" for i in range(1, 22))], "--retry-delays: at most"),
        (["--no-breaker", "--breaker-failures", "3"], "--breaker-failures: the breaker is off"),
        (["--breaker-probe", "soon"], "--breaker-probe: 'soon': not a duration"),
        (["--breaker-probe", "0"], "--breaker-probe: '0': must be more than 0"),
        (["--breaker-probe", "1m", "--breaker-max-probe", "5s"], "--breaker-max-probe: max probe"),
    ],
)
def test_a_bad_value_names_its_flag(args: list[str], says: str) -> None:
    with pytest.raises(UsageError) as info:
        apply_retry(_call_flow(), _parse(*args))
    assert str(info.value).startswith(says), str(info.value)


def test_a_breaker_setting_on_a_flow_without_a_call_effect_is_refused() -> None:
    with pytest.raises(UsageError, match="no call effect; add --breaker"):
        apply_retry(orders_flow("/x"), _parse("--breaker-failures", "2"))


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--retry", "often"], "Invalid value for '--retry'"),
        (["--immediate-retries", "-1"], "Invalid value for '--immediate-retries'"),
        (["--immediate-retries", "101"], "Invalid value for '--immediate-retries'"),
        (["--breaker-failures", "0"], "Invalid value for '--breaker-failures'"),
        (["--retry-delays", "5x"], "onceq: --retry-delays: '5x': not a duration"),
    ],
)
def test_through_the_cli_a_mistake_is_one_line_and_exit_2(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from onceq._cli import _main, app

    @app.command("retry-options-probe", hidden=True)
    @retry_options
    def probe(**values: Any) -> None:
        apply_retry(_call_flow(), values)

    try:
        with pytest.raises(SystemExit) as info:
            _main(["retry-options-probe", *args])
    finally:
        app.commands.pop("retry-options-probe", None)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and says in err and err.startswith("onceq: "), err
