"""`onceq console` and `onceq run --console-port` as a user runs them: where they listen,
what they refuse to start with, and how they stop."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from support import free_port, run_cli

FLOWS = """ledger = "./ledger.db"

[flows.orders]
source = "dirq"
path = "./q"
id_field = "id"
"""
TOKEN = "console-token-for-the-cli-test"


def flow_file(tmp_path: Path) -> Path:
    assert run_cli("dirq", "init", str(tmp_path / "q")).returncode == 0
    (tmp_path / "q" / "inbox" / "a.json").write_text(json.dumps({"id": "a"}))
    f = tmp_path / "flows.toml"
    f.write_text(FLOWS)
    return f


def get(url: str, token: str | None = None) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def wait_answer(url: str, token: str | None = None, seconds: float = 30) -> dict[str, object]:
    deadline = time.monotonic() + seconds
    while True:
        try:
            status, doc = get(url, token)
            if status == 200:
                return doc
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} did not answer")
        time.sleep(0.1)


def listens(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_another_address_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    f = flow_file(tmp_path)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "ONCEQ_CONSOLE_TOKEN"}
    done = subprocess.run(
        [sys.executable, "-m", "onceq", "console", str(f), "--host", "0.0.0.0",
         "--port", str(port)],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "only with a token" in done.stderr and "Traceback" not in done.stderr
    assert not listens(port)
    run = run_cli("run", str(f), "--console-port", str(port), "--console-host", "0.0.0.0",
                  "--until-empty", cwd=tmp_path)  # fmt: skip
    assert run.returncode == 2 and "only with a token" in run.stderr
    assert (tmp_path / "q" / "inbox" / "a.json").exists()  # nothing was consumed


def test_with_a_token_it_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    f = flow_file(tmp_path)
    port = free_port()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "onceq", "console", str(f), "--host", "0.0.0.0",
         "--port", str(port), "--token-file", str(token_file)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        doc = wait_answer(f"http://127.0.0.1:{port}/api/flows", TOKEN)
        assert "orders" in doc["flows"]  # type: ignore[operator]
        assert get(f"http://127.0.0.1:{port}/api/flows")[0] == 403
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"http://0.0.0.0:{port}/" in err and TOKEN not in err


def test_a_port_in_use_exits_4(tmp_path: Path) -> None:
    f = flow_file(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        done = run_cli("console", str(f), "--port", str(port), timeout=60)
    assert done.returncode == 4 and f"--port {port}" in done.stderr


def test_run_serves_the_console_while_it_runs(tmp_path: Path) -> None:
    f = flow_file(tmp_path)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "onceq", "run", str(f), "--console-port", str(port),
         "--max-seconds", "20"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            doc = wait_answer(f"http://127.0.0.1:{port}/api/flows")
            ledger = doc["flows"]["orders"]["ledger"]  # type: ignore[index]
            if ledger["processed"] == 1:
                break
            assert time.monotonic() < deadline, doc
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert not listens(port)  # the console ends with the run
