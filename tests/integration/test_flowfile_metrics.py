"""A flow file's [metrics] table: its mistakes one line each (exit 2, nothing consumed),
and a --metrics-port / --metrics-host flag overriding it."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_support import invoke, sample_queue
from support import free_port

FLOWS = """\
ledger = "./ledger.db"

[flows.orders]
source = "dirq"
path = "./q"
"""


@pytest.fixture
def held_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize(
    ("table", "line"),
    [
        ('[metrics]\nport = "9464"\n', "line 8: metrics.port: must be an integer, not text"),
        ("[metrics]\nport = 70000\n", "line 8: metrics.port: must be 1-65535, not 70000"),
        ('[metrics]\nport = 9464\nhots = "x"\n', "line 9: metrics.hots: unknown key"),
        ('[metrics]\nhost = ""\n', "line 8: metrics.host: must be an address or a host name"),
        ("metrics = 9464\n", "line 1: metrics: must be a table ([metrics] with host and port)"),
    ],
)
def test_a_metrics_mistake_is_one_line_and_nothing_runs(
    tmp_path: Path, table: str, line: str
) -> None:
    q = sample_queue(tmp_path)
    before = sorted(p.name for p in (q / "inbox").iterdir())
    f = tmp_path / "flows.toml"
    # A top-level key must come before the first table; a table may come anywhere.
    f.write_text(table + FLOWS if not table.startswith("[") else FLOWS + "\n" + table)
    for cmd in (["check", str(f)], ["run", str(f), "--until-empty"]):
        r = invoke(*cmd)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"onceq: {f}: {line}"), lines
    assert sorted(p.name for p in (q / "inbox").iterdir()) == before
    assert not (tmp_path / "ledger.db").exists()


def test_the_files_port_in_use_refuses_the_run(tmp_path: Path, held_port: int) -> None:
    q = sample_queue(tmp_path)
    f = tmp_path / "flows.toml"
    f.write_text(FLOWS + f"\n[metrics]\nport = {held_port}\n")
    r = invoke("run", str(f), "--until-empty")
    assert r.returncode == 4, r.stderr
    assert r.stderr == f"onceq: 127.0.0.1:{held_port}: cannot serve metrics: the port is in use\n"
    assert not (tmp_path / "ledger.db").exists()
    assert len(list((q / "inbox").iterdir())) == 20


def test_a_flag_overrides_the_files_port_and_host(tmp_path: Path, held_port: int) -> None:
    sample_queue(tmp_path)
    f = tmp_path / "flows.toml"
    # The file's port is taken and its host is no address of this machine: the flags win.
    f.write_text(FLOWS + f'\n[metrics]\nport = {held_port}\nhost = "192.0.2.1"\n')
    port = free_port()
    r = invoke(
        "run", str(f), "--until-empty", "--metrics-port", str(port), "--metrics-host", "127.0.0.1"
    )
    assert r.returncode == 0, r.stderr
    # And the file's host is used when no flag names one (192.0.2.1 is not ours: refused).
    r = invoke("run", str(f), "--until-empty", "--metrics-port", str(port))
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"onceq: 192.0.2.1:{port}: cannot serve metrics: ")
