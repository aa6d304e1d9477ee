"""Live progress of a consume run: a status line on a terminal, nothing when piped.

The runs are real processes. "A terminal" is a pseudo-terminal from python's pty
module (stdout and stderr both on it, as in an interactive shell); "piped" is the
same command with both streams captured.
"""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_support import sample_queue
from mq_support import CLAIMS, EXERCISE, partner, publish, topology
from support import run_cli

CLEAR = "\r\x1b[2K"


def run_in_pty(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> tuple[int, str]:
    """Run `python -m onceq ARGS` with a pseudo-terminal as stdout and stderr."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "onceq", *args],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "TERM": "xterm", "COLUMNS": "200", **(env or {})},
        close_fds=True,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while True:  # read until the child's end closes the terminal (EIO on Linux)
        assert time.monotonic() < deadline, b"".join(chunks)
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=30), b"".join(chunks).decode(errors="replace")


def test_dirq_consume_on_a_terminal_shows_progress_and_erases_it(tmp_path: Path) -> None:
    q = sample_queue(tmp_path)
    code, out = run_in_pty("dirq", "consume", str(q))
    assert code == 0, out
    # The status line: its final counts are drawn once before it is erased, so this
    # holds however fast the run was.
    final = (
        r"20 settled · \d+ msg/s · \d+s · 15 processed, 3 duplicates, 0 requeued,"
        rf" 2 quarantined · {re.escape(str(q))}"
    )
    assert re.search(final, out), out
    assert out.count(CLEAR) >= 2  # drawn, and erased before the summary
    # The summary follows the erased line, whole.
    summary = out.rsplit(CLEAR, 1)[1]
    assert f"{q}: 20 received, 15 processed" in summary, out
    assert "settled" not in summary


def test_dirq_consume_piped_shows_no_progress(tmp_path: Path) -> None:
    q = sample_queue(tmp_path)
    r = run_cli("dirq", "consume", str(q))
    assert r.returncode == 0, r.stderr
    # Only the new-ledger note (this run made the ledger): no progress line, no escapes.
    assert r.stderr.splitlines() == [
        f"onceq: new ledger at {q / 'ledger.db'}: no message seen before"
    ]
    assert "settled" not in r.stdout and "\x1b" not in r.stdout and "\r" not in r.stdout
    assert r.stdout.splitlines() == [
        f"{q}: 20 received, 15 processed, 3 duplicates, 0 recovered,"
        " 2 quarantined (missing-field 1, parse 1)"
    ]


@pytest.mark.broker
def test_mq_consume_on_a_terminal_refreshes_progress_piped_shows_none(
    amqp_url: str, tmp_path: Path
) -> None:
    topology(amqp_url)
    claims = sorted(CLAIMS.glob("*.json"))
    env = {"EAI_AMQP_URL": amqp_url}
    with partner() as p:
        publish(amqp_url, *claims)
        # The exercise's rule: the 503 is requeued once, then dead (no delayed retry).
        args = ("mq", "consume", "--claim", p.url, "--max-seconds", "3", *EXERCISE)
        code, out = run_in_pty(*args, "--db", str(tmp_path / "a.db"), env=env)
        assert code == 0, out
        # The sample settles 10 deliveries (the BUSY claim twice); the line is redrawn
        # every 0.25 s for the 3 s the run lasts, whether or not anything settles.
        assert re.search(
            r"10 settled · \d+ msg/s · \d+s · 6 processed, 1 duplicates, 1 requeued,"
            r" 2 dead · claim.in",
            out,
        ), out
        # The new-ledger note is a line of its own, not glued to the progress line.
        assert re.search(r"(^|\n|\x1b\[2K)onceq: new ledger at ", out), out
        assert out.count(CLEAR) >= 5, out
        assert "6 processed" in out.rsplit(CLEAR, 1)[1]

        publish(amqp_url, *claims)
        r = run_cli(*args, "--db", str(tmp_path / "b.db"), env=env)
    assert r.returncode == 0, r.stderr
    assert "settled" not in r.stdout + r.stderr
    assert "\x1b" not in r.stdout + r.stderr and "\r" not in r.stdout + r.stderr
    assert r.stdout.startswith("10 received, 6 processed, 1 duplicates"), r.stdout


def test_the_rate_survives_an_80_column_terminal() -> None:
    """The line is cut at the terminal's width: the count and the rate come first, so
    a five-digit count and a long queue path do not push the rate off the line."""
    import io

    from onceq._cli.progress import StatusLine

    line = StatusLine("/srv/" + "a-long-folder/" * 8 + "q", "quarantined", io.StringIO())
    line.stats.received = line.stats.processed = 11264
    assert re.match(r"11264 settled · \d+ msg/s · \d+s · 11264 processed", line.text()[:79])
