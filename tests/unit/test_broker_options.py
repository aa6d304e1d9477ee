"""The flags RabbitMQ's and NATS's commands share come from one factory per block
(onceq._cli.broker_options, onceq._cli.broker_consume_options): the same spelling, type,
bounds and order in both, only the arguments (a default, a help's words) differing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest

from onceq._cli.mq_consume import consume as mq_consume
from onceq._cli.mq_publish import publish as mq_publish
from onceq._cli.mq_topology import topology as mq_topology
from onceq._cli.nats_consume import consume as nats_consume
from onceq._cli.nats_publish import publish as nats_publish
from onceq._cli.nats_setup import setup as nats_setup
from onceq._sources.nats.names import DEFAULT_PREFETCH


def _opts(cmd: click.Command) -> list[str]:
    return [p.name or "" for p in cmd.params if isinstance(p, click.Option)]


def _shape(p: click.Parameter) -> tuple[Any, ...]:
    t = p.type
    bounds = (getattr(t, "min", None), getattr(t, "max", None))
    return (
        tuple(p.opts),
        type(t).__name__,
        bounds,
        p.is_flag if isinstance(p, click.Option) else None,
    )


def _block(cmd: click.Command, first: str, last: str) -> list[click.Parameter]:
    names = _opts(cmd)
    opts = [p for p in cmd.params if isinstance(p, click.Option)]
    return opts[names.index(first) : names.index(last) + 1]


PAIRS = [
    (mq_consume, nats_consume, "required", "as_json"),
    (mq_publish, nats_publish, "id_field", "as_json"),
    (mq_topology, nats_setup, "flow_file", "as_json"),
]


@pytest.mark.parametrize(
    ("mq", "nats", "first", "last"), PAIRS, ids=["consume", "publish", "setup"]
)
def test_a_shared_block_is_the_same_flags_in_both_brokers(
    mq: click.Command, nats: click.Command, first: str, last: str
) -> None:
    a, b = _block(mq, first, last), _block(nats, first, last)
    if mq is mq_topology:  # its retry tiers are listed between --flows and --json
        a = [p for p in a if p.name in {"flow_file", "as_json"}]
    assert [_shape(p) for p in a] == [_shape(p) for p in b]
    assert len(a) >= 2


def test_what_differs_between_the_brokers_is_only_the_arguments() -> None:
    def param(cmd: click.Command, name: str) -> click.Parameter:
        return next(p for p in cmd.params if p.name == name)

    assert param(mq_consume, "prefetch").default == 5
    assert param(nats_consume, "prefetch").default == DEFAULT_PREFETCH
    assert "message_id" in (getattr(param(mq_publish, "id_field"), "help", "") or "")
    assert "Nats-Msg-Id" in (getattr(param(nats_publish, "id_field"), "help", "") or "")
    assert param(mq_consume, "timeout").default == param(nats_consume, "timeout").default == 10.0


@pytest.mark.parametrize("group", ["mq", "nats"])
def test_a_bad_id_field_is_refused_alike_by_both_publishers(group: str, tmp_path: Path) -> None:
    f = tmp_path / "m.json"
    f.write_text('{"guid": "a"}')
    extra = ["--subject", "s"] if group == "nats" else []
    args = [group, "publish", str(f), *extra, "--id-field", "a..b"]
    out = subprocess.run(
        [sys.executable, "-m", "onceq", *args], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "onceq: --id-field: 'a..b': not a field name or dotted path"
    ]
