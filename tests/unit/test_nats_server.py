"""The tests' own NATS server (tests/nats_server.py): it starts with JetStream, a message
published before a kill -9 is still there after the restart on the same port and
store, and nothing of it is left afterwards."""

from __future__ import annotations

import asyncio
import socket
import uuid
from pathlib import Path

import pytest

from nats_server import NatsServer, jetstream_answers, nats_server, own_nats  # noqa: F401

nats = pytest.importorskip("nats")


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


async def publish(url: str, stream: str, body: bytes, msg_id: str) -> int:
    nc = await nats.connect(url, connect_timeout=5)
    try:
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[f"{stream}.in"])
        ack = await js.publish(f"{stream}.in", body, headers={"Nats-Msg-Id": msg_id})
        return int(ack.seq)
    finally:
        await nc.close()


async def fetch_one(url: str, stream: str) -> tuple[bytes, str | None]:
    nc = await nats.connect(url, connect_timeout=5)
    try:
        sub = await nc.jetstream().pull_subscribe(f"{stream}.in", durable="d", stream=stream)
        (msg,) = await sub.fetch(1, timeout=5)
        await msg.ack_sync()
        return msg.data, (msg.headers or {}).get("Nats-Msg-Id")
    finally:
        await nc.close()


def test_a_message_survives_a_kill_9_and_a_restart_on_the_same_port(
    own_nats: NatsServer,  # noqa: F811
) -> None:
    assert own_nats.port != 4222  # never the shared server
    assert jetstream_answers(own_nats.port, name=own_nats.name)
    stream = f"T{uuid.uuid4().hex[:8]}"
    seq = asyncio.run(publish(own_nats.url, stream, b'{"id": "m1"}', "m1"))
    assert seq == 1
    pid = own_nats.proc.pid if own_nats.proc else None

    own_nats.kill()
    assert not own_nats.running and not listening(own_nats.port)
    own_nats.start()
    assert own_nats.running and own_nats.proc is not None and own_nats.proc.pid != pid
    assert own_nats.starts == 2

    assert asyncio.run(fetch_one(own_nats.url, stream)) == (b'{"id": "m1"}', "m1")


def test_restart_is_kill_then_start_and_a_second_start_is_refused(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "store")
    try:
        server.start()
        with pytest.raises(RuntimeError, match="already running"):
            server.start()
        port = server.port
        server.restart(down_s=0.2)
        assert server.port == port and server.starts == 2 and jetstream_answers(port)
    finally:
        server.stop()
    assert not listening(port)


def test_nothing_is_left_afterwards() -> None:
    with nats_server() as server:
        store, port, proc = server.store, server.port, server.proc
        assert store.is_dir() and proc is not None
    assert proc.poll() is not None  # stopped
    assert not store.parent.exists()  # store and log removed
    assert not listening(port)


def test_a_server_that_cannot_start_says_why(tmp_path: Path) -> None:
    with nats_server() as taken:  # its port is taken: the second server cannot bind it
        other = NatsServer(tmp_path / "store", port=taken.port)
        try:
            with pytest.raises(RuntimeError, match=rf"127\.0\.0\.1:{taken.port}.*did not answer"):
                other.start(timeout=10)
            assert not other.running
        finally:
            other.stop()
        assert jetstream_answers(taken.port, name=taken.name)  # the first one is untouched


def test_a_server_without_jetstream_does_not_count_as_answering(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "store")
    import subprocess

    proc = subprocess.Popen(
        [server.binary, "-a", "127.0.0.1", "-p", str(server.port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(50):
            if listening(server.port):
                break
            asyncio.run(asyncio.sleep(0.1))
        assert listening(server.port)
        assert not jetstream_answers(server.port, timeout=1.0)
    finally:
        proc.kill()
        proc.wait()
