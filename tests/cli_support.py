"""The `onceq` command run in this process, through its real entry point (`onceq._cli.main`).

A new Python process costs 0.2-0.5 s (the interpreter, onceq's imports); a command
whose point is its arguments, its output and its exit code runs here in a few ms with
the same masking streams and error mapping. What a process of its own would have
started from is put back around each call: the process-wide state the CLI sets
(its log handler and levels, captured warnings, the JSON-log switch, the remembered
secrets, rich's consoles bound to the streams of the call), the environment, the
working directory.

What only a real process shows stays in a real process (support.run_cli): signals,
kill -9, the early catch of a stop signal at import, fault points armed from the
environment at import, several consumers at once, the installed `onceq` script.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import click.formatting
from click.testing import CliRunner

from support import SAMPLE

_QUIETENED = ("aiormq", "aio_pika")  # onceq._core.logs.setup sets their levels
# Read once, when a process starts (Python's own start, onceq._core.faults at import):
# laid over this process's environment they would change nothing, silently.
READ_AT_START = {"PYTHONPATH", "PYTHONHOME", "ONCEQ_FAULT", "ONCEQ_FAULT_AFTER"}


@contextlib.contextmanager
def _fresh_process_state() -> Iterator[None]:
    """Put back, afterwards, what the CLI changes for the whole process."""
    import onceq._cli.output as output  # after the test process's own imports of onceq
    import onceq._core.logs as logs
    import onceq._core.redact as redact

    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    levels = {n: logging.getLogger(n).level for n in _QUIETENED}
    remembered = set(redact._remembered)
    output._console = output._err_console = None  # bound to the previous call's streams
    try:
        yield
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        logging.captureWarnings(False)
        logs._format = "human"
        redact._remembered.clear()
        redact._remembered.update(remembered)
        output._console = output._err_console = None


def _forks(args: list[str]) -> bool:
    """`--workers N` with N > 1: the run forks, and a fork of the test process is no user's."""
    for i, arg in enumerate(args):
        value = arg.partition("=")[2] if arg.startswith("--workers=") else ""
        if arg == "--workers" and i + 1 < len(args):
            value = args[i + 1]
        if value.isdigit() and int(value) > 1:
            return True
    return False


def _help_width(env: dict[str, str] | None) -> int:
    """The width click wraps help at in a process whose stdout is a pipe: 80 columns
    (or $COLUMNS) less 2, at least 50 (click.formatting.HelpFormatter)."""
    columns = {**os.environ, **(env or {})}.get("COLUMNS", "")
    return max(min(int(columns) if columns.isdigit() else 80, 80) - 2, 50)


def run_here(
    args: list[str],
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    help_width: int = 80,
) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `onceq ARGS` run in this process.

    `env` is laid over this process's environment for the call (as run_cli lays it over
    the child's); `cwd` is the working directory for the call; click wraps help at
    `help_width` columns (80: click's isolation's own).
    """
    from onceq._cli import main

    with (
        _fresh_process_state(),
        contextlib.chdir(cwd if cwd is not None else os.getcwd()),
        CliRunner().isolation(env=env or {}) as (out, err, _),
    ):
        click.formatting.FORCED_WIDTH = help_width  # isolation puts it back
        try:
            main(args)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        stdout = out.getvalue().decode("utf-8", "replace")
        stderr = err.getvalue().decode("utf-8", "replace")
    # A child's text-mode pipes read "\r\n" as "\n": the same here.
    return code, stdout.replace("\r\n", "\n"), stderr.replace("\r\n", "\n")


def invoke(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """support.run_cli's call and answer, the command run in this process.

    `timeout` is accepted for the same call; pytest-timeout bounds a call here.
    """
    del timeout
    argv = list(args)
    # What this process cannot stand in for: it would pass here and test nothing.
    assert not _forks(argv), f"{argv}: --workers forks; run it in a process of its own (run_cli)"
    changed = {k for k, v in (env or {}).items() if os.environ.get(k) != v}
    read_at_start = sorted(changed & READ_AT_START)
    assert not read_at_start, f"{read_at_start}: read when a process starts; use run_cli"
    # click's isolation wraps help at 80 columns; a process on a pipe 2 narrower.
    code, stdout, stderr = run_here(argv, env, cwd, help_width=_help_width(env))
    return subprocess.CompletedProcess(["onceq", *args], code, stdout, stderr)


def init_queue(q: Path, source: Path | None = None) -> Path:
    """`onceq dirq init Q [--from SOURCE]`, asserted to succeed: the queue folder Q."""
    r = invoke("dirq", "init", str(q), *(("--from", str(source)) if source is not None else ()))
    assert r.returncode == 0, r.stderr
    return q


def sample_queue(root: Path, source: Path = SAMPLE) -> Path:
    """ROOT/q, a queue folder holding the sample's messages (or SOURCE's)."""
    return init_queue(root / "q", source)
