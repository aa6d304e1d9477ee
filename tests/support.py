"""Helpers for tests (importable as `support`: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

BROKER = ("127.0.0.1", 5672)
SAMPLE = Path(__file__).resolve().parents[1] / "src" / "onceq" / "_exercise" / "sample"


MANAGEMENT = "http://127.0.0.1:15672"
GUEST = "Basic " + base64.b64encode(b"guest:guest").decode()


def management(method: str, path: str, body: dict[str, str] | None = None) -> Any:
    """One call of the broker's management API, its JSON answer (None when empty);
    raises on a status other than 2xx."""
    req = urllib.request.Request(
        f"{MANAGEMENT}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": GUEST, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        raw = r.read()
    return json.loads(raw) if raw else None


def broker_answers() -> bool:
    try:
        socket.create_connection(BROKER, timeout=2).close()
        return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """An HTTP server of `handler` on a free loopback port, in a thread of this process,
    for the block: its base URL. The one home of every in-test partner and web server."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True  # a kept-alive connection must not hold the close up
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def run_cli(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run `python -m onceq ARGS` as a user would, capturing its output."""
    return subprocess.run(
        [sys.executable, "-m", "onceq", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=timeout,
    )


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under root (a ledger and its -wal/-shm included) with a hash of its bytes.

    Collects garbage first: a sqlite3 connection that a test left to the garbage
    collector would otherwise close (and delete the ledger's -wal/-shm files) at a
    random moment in the middle of the walk. Tests open sqlite3 with `open_db(path)`,
    which closes (a bare `with sqlite3.connect(p)` commits but never closes).
    """
    import gc
    import hashlib

    gc.collect()
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = "dir"
        for f in filenames:
            p = os.path.join(dirpath, f)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                out[rel] = "link:" + os.readlink(p)
            else:
                with open(p, "rb") as fh:
                    out[rel] = hashlib.sha256(fh.read()).hexdigest()
    return out


@contextlib.contextmanager
def open_db(path: str | Path) -> Iterator[sqlite3.Connection]:
    """A sqlite3 connection that is committed on success and always closed.

    `with sqlite3.connect(p) as c` only commits: the connection sits in a reference
    cycle and stays open until a garbage collection, which can then delete the
    ledger's -wal/-shm files under a test's feet.
    """
    conn = sqlite3.connect(path)
    try:
        with conn:
            yield conn
    finally:
        conn.close()


def plain_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a user who has not activated the venv.

    PATH without the venv's bin/, no VIRTUAL_ENV or PYTHONPATH: `python3` is then the
    machine's own interpreter. That interpreter must not be able to import onceq —
    asserted here, because a machine whose python3 can import onceq (an install
    outside the venv) makes every test of the generated scripts pass for nothing.
    """
    venv_bin = os.path.realpath(os.path.dirname(sys.executable))
    path = [
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and os.path.realpath(d) != venv_bin
    ]
    drop = {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "ONCEQ_LAB_PYTHON"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = os.pathsep.join(path)
    env.update(extra or {})
    probe = subprocess.run(
        ["python3", "-c", "import onceq"], env=env, cwd="/", capture_output=True, timeout=60
    )
    assert probe.returncode != 0, (
        "python3 outside the venv can import onceq: this machine is contaminated "
        "(onceq installed outside the venv), so the generated scripts cannot be tested here"
    )
    return env


def in_process(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run `onceq ARGS` through its real entry point in this process: (exit code, output)."""
    from cli_support import run_here  # cli_support imports this module

    code, stdout, stderr = run_here(args, env)
    return code, stdout + stderr
