"""The CLI as a whole: every command has help with an example; mistakes are one line."""

from __future__ import annotations

import click
import pytest

from onceq.cli import _register, app
from support import run_cli


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
    r = run_cli(*path, "--help")
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
    r = run_cli(*argv)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onceq: "), r.stderr
    assert "--help" in lines[0]
    assert r.stdout == ""


def test_a_missing_queue_is_exit_3_and_creates_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    r = run_cli("dirq", "consume", str(tmp_path / "q"))
    assert r.returncode == 3
    assert r.stderr.strip().splitlines() == [
        f"onceq: {tmp_path / 'q'}: not a queue (missing inbox, processing, done, error/)"
    ]
    assert list(tmp_path.iterdir()) == []


def test_an_unopenable_ledger_is_exit_8_and_leaves_the_queue_alone(tmp_path) -> None:  # type: ignore[no-untyped-def]
    q = tmp_path / "q"
    assert run_cli("dirq", "init", str(q), "--from", str(_sample())).returncode == 0
    before = sorted(p.name for p in (q / "inbox").iterdir())
    # a missing parent folder is created on demand; a parent that is a file cannot be
    (tmp_path / "file").write_text("")
    r = run_cli("dirq", "consume", str(q), "--db", str(tmp_path / "file" / "x.db"))
    assert r.returncode == 8
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "cannot open the ledger" in r.stderr
    assert sorted(p.name for p in (q / "inbox").iterdir()) == before
    assert list((q / "processing").iterdir()) == []


def _sample():  # type: ignore[no-untyped-def]
    from support import SAMPLE

    return SAMPLE
