"""The CLI as a whole: every command has help with an example; mistakes are one line.

These run in this process (cli_support.invoke), but for the smoke test of the two ways
a user starts onceq: the installed `onceq` script and `python -m onceq`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest

from cli_support import invoke
from onceq._cli import _register, app


def _commands() -> list[tuple[str, ...]]:
    _register()
    out: list[tuple[str, ...]] = []

    def walk(cmd: click.Command, path: tuple[str, ...]) -> None:
        out.append(path)
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(sub, (*path, name))

    walk(app, ())
    return out


@pytest.mark.parametrize("path", _commands(), ids=lambda p: " ".join(p) or "onceq")
def test_every_command_has_help_with_an_example(path: tuple[str, ...]) -> None:
    r = invoke(*path, "--help")
    assert r.returncode == 0, r.stderr
    assert "Example" in r.stdout
    assert "Usage: onceq" in r.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["dirq", "consume"],
        ["dirq", "consume", "q", "--workers", "0"],
        ["dirq", "nosuch"],
        ["dirq", "consume", "q", "--bogus"],
        ["mq", "consume"],
        ["nosuch"],
    ],
    ids=" ".join,
)
def test_usage_mistakes_are_one_line_with_exit_2(argv: list[str]) -> None:
    r = invoke(*argv)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onceq: "), r.stderr
    assert "--help" in lines[0]
    assert r.stdout == ""


def test_a_missing_queue_is_exit_3_and_creates_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    r = invoke("dirq", "consume", str(tmp_path / "q"))
    assert r.returncode == 3
    assert r.stderr.strip().splitlines() == [
        f"onceq: {tmp_path / 'q'}: not a queue (missing inbox, processing, done, error/)"
    ]
    assert list(tmp_path.iterdir()) == []


def test_an_unopenable_ledger_is_exit_8_and_leaves_the_queue_alone(tmp_path) -> None:  # type: ignore[no-untyped-def]
    q = tmp_path / "q"
    assert invoke("dirq", "init", str(q), "--from", str(_sample())).returncode == 0
    before = sorted(p.name for p in (q / "inbox").iterdir())
    # a missing parent folder is created on demand; a parent that is a file cannot be
    (tmp_path / "file").write_text("")
    r = invoke("dirq", "consume", str(q), "--db", str(tmp_path / "file" / "x.db"))
    assert r.returncode == 8
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "cannot open the ledger" in r.stderr
    assert sorted(p.name for p in (q / "inbox").iterdir()) == before
    assert list((q / "processing").iterdir()) == []


def _sample():  # type: ignore[no-untyped-def]
    from support import SAMPLE

    return SAMPLE


@pytest.mark.parametrize(
    "start",
    [[str(Path(sys.executable).with_name("onceq"))], [sys.executable, "-m", "onceq"]],
    ids=["script", "python -m"],
)
def test_the_installed_entry_points_run_the_cli(start: list[str]) -> None:
    """A real process through each entry point: help, a version, a usage mistake's exit 2."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*start, *args], capture_output=True, text=True, timeout=60)

    r = run("--help")
    assert r.returncode == 0 and "Usage: onceq" in r.stdout and "Example" in r.stdout, r
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("onceq, version "), r
    r = run("nosuch")
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.startswith("onceq: ") and len(r.stderr.splitlines()) == 1, r.stderr
