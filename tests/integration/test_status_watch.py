"""`onceq status --watch` in a pseudo-terminal: the screen a person would see.

Python's pty module (stdlib, so no tmux on a fresh machine): the child gets a
160x40 terminal as its controlling tty, the test reads what it draws, consumes more
messages meanwhile, sees the counts and the rate change, then types Ctrl-C (the
terminal's line discipline sends SIGINT, as a keyboard does) and checks the exit
code, the cursor shown again and the last frame left on the screen.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import struct
import sys
import termios
import time
from pathlib import Path

from cli_support import invoke
from mq_support import wait_for

# CSI sequences (cursor moves, colours, erase) and the private modes (?25l / ?25h).
ANSI = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[()][0-9A-B]|\r")
SHOW, HIDE = b"\x1b[?25h", b"\x1b[?25l"


class Screen:
    """A child process on a pty, and everything it wrote."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        # openpty + fork, not pty.fork: the parent keeps the terminal's slave side open,
        # so what the child writes last (the cursor shown again) is still there to read
        # after it exited: Linux drops a pty's unread output when its last slave closes.
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
        pid = os.fork()
        if pid == 0:  # the child: the pty as its controlling tty, SIGINT as a tty gives it
            try:
                os.close(master)
                os.setsid()
                fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
                for n in (0, 1, 2):
                    os.dup2(slave, n)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.chdir(cwd)
                env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "160", "LINES": "40"}
                env.pop("NO_COLOR", None)
                os.execve(sys.executable, [sys.executable, *argv], env)
            finally:
                os._exit(127)
        self.pid, self.fd, self.slave = pid, master, slave
        self.raw = b""
        self.status: int | None = None

    def close(self) -> None:
        os.close(self.fd)
        os.close(self.slave)

    def pump(self, timeout: float = 0.1) -> None:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                chunk = b""
            self.raw += chunk

    def text(self) -> str:
        return ANSI.sub(b"", self.raw).decode("utf-8", "replace")

    def row(self, flow: str) -> list[str] | None:
        """The cells of the newest frame's row of `flow`."""
        rows = [ln for ln in self.text().split("\n") if f"│ {flow} " in ln]
        if not rows:
            return None
        return [c.strip() for c in rows[-1].strip().strip("│").split("│")]

    def wait_row(self, flow: str, pred: object, timeout: float = 30) -> list[str]:
        found: list[list[str]] = []

        def ok() -> bool:
            self.pump()
            r = self.row(flow)
            if r is not None and pred(r):  # type: ignore[operator]
                found.append(r)
                return True
            return False

        wait_for(ok, timeout, step=0)
        return found[-1]

    def ctrl_c(self) -> int:
        os.write(self.fd, b"\x03")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self.pump()
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                for _ in range(20):  # what it wrote last
                    self.pump(0.05)
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        raise AssertionError("status --watch did not stop on Ctrl-C")


def test_watch_refreshes_the_counts_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    (tmp_path / "flows.toml").write_text(
        'ledger = "ledger.db"\n[flows.files]\nsource = "dirq"\npath = "q"\nid_field = "id"\n'
    )
    assert invoke("dirq", "init", str(tmp_path / "q")).returncode == 0
    inbox = tmp_path / "q" / "inbox"
    for i in range(3):
        (inbox / f"a{i}.json").write_text(f'{{"id": "a{i}"}}')
    assert invoke("run", "flows.toml", "--until-empty", cwd=tmp_path).returncode == 0

    # columns: flow, queue, oldest, processed, dup, dead, breaker, consumers, rate, dead/s
    screen = Screen(["-m", "onceq", "status", "--watch", "--interval", "0.3"], tmp_path)
    try:
        first = screen.wait_row("files", lambda r: r[3] == "3")
        assert first[1].startswith("inbox 0") and first[8] in ("-", "0.0")
        for i in range(4):
            (inbox / f"b{i}.json").write_text(f'{{"id": "b{i}"}}')
        # Files waiting: the queue cell says so on the next refresh.
        screen.wait_row("files", lambda r: r[1].startswith("inbox 4"))
        assert invoke("run", "flows.toml", "--until-empty", cwd=tmp_path).returncode == 0
        later = screen.wait_row("files", lambda r: r[3] == "7" and r[1].startswith("inbox 0"))
        assert float(later[8]) > 0  # processed/s over the last minute: 4 new ones
        assert "rates over the last minute" in screen.text()
        code = screen.ctrl_c()
    finally:
        if screen.status is None:
            try:
                os.kill(screen.pid, signal.SIGKILL)
                os.waitpid(screen.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        screen.close()
    assert code == 0, screen.text()[-2000:]
    # The cursor hidden while live, shown again at the end; the last frame kept (the
    # final table is the last thing on screen, no erase after it).
    assert HIDE in screen.raw and screen.raw.rfind(SHOW) > screen.raw.rfind(HIDE)
    tail = screen.text().rstrip().split("\n")
    last = [ln for ln in tail[-12:] if "│ files " in ln]
    assert last and [c.strip() for c in last[-1].strip().strip("│").split("│")][3] == "7", tail
    assert "Traceback" not in screen.text() and "interrupted" not in screen.text()


def test_sigterm_restores_the_cursor_and_exits_143(tmp_path: Path) -> None:
    (tmp_path / "flows.toml").write_text(
        'ledger = "ledger.db"\n[flows.files]\nsource = "dirq"\npath = "q"\nid_field = "id"\n'
    )
    assert invoke("dirq", "init", str(tmp_path / "q")).returncode == 0
    screen = Screen(["-m", "onceq", "status", "--watch", "--interval", "0.3"], tmp_path)
    try:
        screen.wait_row("files", lambda r: r[1].startswith("inbox 0"))
        os.kill(screen.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while not (done := os.waitpid(screen.pid, os.WNOHANG))[0]:
            assert time.monotonic() < deadline
            screen.pump()
        for _ in range(20):
            screen.pump(0.05)
    finally:
        screen.close()
    assert os.waitstatus_to_exitcode(done[1]) == 143
    assert screen.raw.rfind(SHOW) > screen.raw.rfind(HIDE) >= 0
    assert "Traceback" not in screen.text()


def test_watch_json_is_one_document_a_line_with_rates(tmp_path: Path) -> None:
    import json
    import subprocess

    (tmp_path / "flows.toml").write_text(
        'ledger = "ledger.db"\n[flows.files]\nsource = "dirq"\npath = "q"\nid_field = "id"\n'
    )
    assert invoke("dirq", "init", str(tmp_path / "q")).returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "onceq", "status", "--watch", "--json", "--interval", "0.2"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # SIGINT at its default, as a terminal's Ctrl-C finds it (not a background job's).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    docs = [json.loads(proc.stdout.readline())]
    (tmp_path / "q" / "inbox" / "m.json").write_text('{"id": "m"}')
    assert invoke("run", "flows.toml", "--until-empty", cwd=tmp_path).returncode == 0
    while docs[-1]["flows"]["files"]["ledger"]["processed"] != 1:
        docs.append(json.loads(proc.stdout.readline()))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and err == "", err
    assert docs[0]["flows"]["files"]["rates"]["processed_per_s"] is None  # one snapshot
    assert docs[-1]["flows"]["files"]["rates"]["processed_per_s"] > 0
