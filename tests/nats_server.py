"""The tests' own NATS server with JetStream: one per test that kills or restarts it.

The machine's server on 127.0.0.1:4222 is shared by every test and every helper: a
test that kills it would break the others. A fault test ("the server killed -9 and
restarted mid-run") takes `own_nats` instead: `nats-server -js -p PORT -sd DIR` on a
free port with a store folder of its own, started and waited for until JetStream
answers, killed -9 (`kill`), started again on the same port and store (`start`): a
stream and its messages survive as JetStream keeps them on disk, and the consumers'
reconnecting clients find the server where it was. Stopped and its store removed
afterwards.

`jetstream_answers` speaks NATS's text protocol with a socket (no client library): the
readiness check is then the same whatever nats-py version a venv holds, and works in
the fixture before any client is made.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

SHARED_URL = "nats://127.0.0.1:4222"


def server_binary() -> str | None:
    return (
        os.environ.get("ONCEQ_NATS_SERVER")
        or shutil.which("nats-server")
        or next((p for p in ("/usr/sbin/nats-server",) if os.access(p, os.X_OK)), None)
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def jetstream_answers(port: int, timeout: float = 2.0, name: str | None = None) -> bool:
    """Whether JetStream on 127.0.0.1:port answers an account-info request without an
    error (and, given `name`, whether the server there is the one of that name: another
    process on the port must not pass for ours). A server without JetStream (or still
    recovering its store) has no responder yet: no answer within `timeout` is False."""
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            f = s.makefile("rb")
            info = f.readline()
            if not info.startswith(b"INFO "):
                return False
            if name is not None and json.loads(info[5:]).get("server_name") != name:
                return False
            s.sendall(
                b'CONNECT {"verbose":false,"pedantic":false,"name":"onceq-tests"}\r\n'
                b"SUB _INBOX.onceq_t 1\r\nPUB $JS.API.INFO _INBOX.onceq_t 0\r\n\r\n"
            )
            while time.monotonic() < deadline:
                line = f.readline()
                if line.startswith(b"PING"):
                    s.sendall(b"PONG\r\n")
                elif line.startswith(b"MSG "):
                    body = f.read(int(line.split()[-1]) + 2)
                    return "error" not in json.loads(body)
                elif not line or line.startswith(b"-ERR"):
                    return False
    except (OSError, ValueError):
        return False
    return False


class NatsServer:
    """One nats-server process of a test, on its own port and store, restartable."""

    def __init__(self, store: Path, port: int | None = None, binary: str | None = None):
        found = binary or server_binary()
        if found is None:
            raise FileNotFoundError("nats-server: not found (apt-get install nats-server)")
        self.binary = found
        self.store = store
        self.port = port or free_port()
        self.log = store.parent / f"{store.name}.log"
        # A name of its own, checked in the server's INFO: start() waits for THIS
        # server, not for whatever else answers on the port.
        self.name = f"onceq-test-{uuid.uuid4().hex[:12]}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def argv(self) -> list[str]:
        port, store = str(self.port), str(self.store)
        return [self.binary, "-js", "-a", "127.0.0.1", "-p", port, "-n", self.name, "-sd", store]

    def start(self, timeout: float = 30.0) -> NatsServer:
        """Start it (again: the same port and store) and wait until JetStream answers."""
        if self.running:
            raise RuntimeError(f"nats-server on {self.port} is already running")
        self.store.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            # Its own session: a ^C of the test run does not reach it first, and
            # kill() reaches exactly this process.
            self.proc = subprocess.Popen(
                self.argv(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.starts += 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if jetstream_answers(self.port, timeout=1.0, name=self.name):
                return self
            time.sleep(0.1)
        # A port taken between free_port() and the start, a store it cannot open: say
        # what the server said, not only that it did not come up.
        self.stop()
        tail = self.log.read_text(errors="replace").splitlines()[-10:]
        raise RuntimeError(
            f"nats-server on 127.0.0.1:{self.port} (store {self.store}) did not answer"
            f" within {timeout:.0f} s:\n" + "\n".join(tail)
        )

    def kill(self) -> None:
        """kill -9: no shutdown, no flush beyond what JetStream already wrote."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def restart(self, down_s: float = 0.0, timeout: float = 30.0) -> NatsServer:
        """kill -9, stay down `down_s` seconds, start again on the same port and store."""
        self.kill()
        if down_s:
            time.sleep(down_s)
        return self.start(timeout=timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None


@contextlib.contextmanager
def nats_server(port: int | None = None) -> Iterator[NatsServer]:
    """A started NatsServer with a temporary store; stopped and removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="onceq-nats-"))
    server = NatsServer(folder / "store", port=port)
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def own_nats() -> Iterator[NatsServer]:
    """The test's own JetStream server (never the shared one): kill() and start() it.

    Without nats-server the test fails under CI=true and is skipped elsewhere, as the
    broker's and PostgreSQL's fixtures do.
    """
    if server_binary() is None:
        msg = "nats-server is not installed (apt-get install nats-server)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    with nats_server() as server:
        yield server
