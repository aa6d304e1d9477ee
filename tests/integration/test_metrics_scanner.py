"""The directory queue's metrics scan runs in a child process (onceq._sources.dirq.scanner).

What must hold: the figures are the folder's, the child never outlives its consumer
(a clean stop or a SIGKILL of the consumer ends it), and a dead child costs nothing
but the process: the consumer scans in a thread from then on and goes on.
A real `onceq run FILE` with a [metrics] table on a directory-queue flow whose
effect is the ledger row (a run that waits for files until it is stopped).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from metrics_support import Scrape, answers
from mq_support import wait_for
from support import free_port

EVERY_S = 5.0  # onceq._sources.dirq.scan.EVERY_S


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out.extend(int(c) for c in text)
    return out


def _scanner_of(pid: int, timeout: float = 30) -> int:
    """The scanner child's pid. Waited for: between its fork and its exec a child still
    shows its parent's command line, a moment that lasts on a loaded machine."""
    deadline = time.monotonic() + timeout
    while True:
        for child in _children(pid):
            try:
                cmd = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            except FileNotFoundError:
                continue
            if b"onceq._sources.dirq.scanner" in cmd:
                return child
        if time.monotonic() > deadline:
            raise AssertionError(f"no scanner child of {pid}: {_children(pid)}")
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.split(")")[-1].split()[0] != "Z"


def _start(tmp: Path) -> tuple[subprocess.Popen[str], int, Path]:
    q = tmp / "q"
    for sub in ("inbox", "processing", "done", "error"):
        (q / sub).mkdir(parents=True)
    port = free_port()
    (tmp / "flows.toml").write_text(
        f'ledger = "./ledger.db"\n[metrics]\nport = {port}\n'
        '[flows.orders]\nsource = "dirq"\npath = "./q"\nid_field = "msg_id"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "onceq", "run", str(tmp / "flows.toml"), "--json"],
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: answers(port), timeout=30)
    return proc, port, q


def _queue(q: Path, names: list[str], mtime: float) -> None:
    for name in names:
        tmp = q / f".{name}.tmp"
        tmp.write_text(json.dumps({"msg_id": name}))
        os.utime(tmp, (mtime, mtime))
        tmp.rename(q / "error" / name)  # error/ files wait: the consumer leaves them


def test_the_figures_are_the_folders_and_the_scanner_ends_with_a_clean_stop(
    tmp_path: Path,
) -> None:
    proc, port, q = _start(tmp_path)
    try:
        scanner = _scanner_of(proc.pid)
        _queue(q, [f"e-{i}.json" for i in range(7)], time.time() - 100)
        wait_for(
            lambda: Scrape(port).value("onceq_queue_messages", flow="orders", state="error") == 7,
            timeout=3 * EVERY_S,
        )
        assert Scrape(port).value("onceq_queue_messages", flow="orders", state="inbox") == 0
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
        assert proc.returncode == 0
        wait_for(lambda: not _alive(scanner), timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_a_sigkilled_consumer_takes_its_scanner_with_it(tmp_path: Path) -> None:
    proc, _port, _q = _start(tmp_path)
    scanner = _scanner_of(proc.pid)
    proc.kill()
    proc.communicate()
    # Its stdin's EOF ends it: nothing of the consumer is left running.
    wait_for(lambda: not _alive(scanner), timeout=10)


def test_a_dead_scanner_leaves_the_run_and_its_figures_going(tmp_path: Path) -> None:
    proc, port, q = _start(tmp_path)
    try:
        os.kill(_scanner_of(proc.pid), signal.SIGKILL)
        _queue(q, [f"e-{i}.json" for i in range(3)], time.time() - 50)
        # The thread takes over: the new files are counted all the same.
        wait_for(
            lambda: Scrape(port).value("onceq_queue_messages", flow="orders", state="error") == 3,
            timeout=3 * EVERY_S,
        )
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
