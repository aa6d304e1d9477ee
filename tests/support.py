"""Helpers for tests (importable as `support`: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

BROKER = ("127.0.0.1", 5672)
SAMPLE = Path(__file__).resolve().parents[1] / "src" / "onceq" / "sample"


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
