"""Shared helpers for the NATS JetStream benchmarks (bench/nats_*.py).

Every run uses streams of its own on the server at ONCEQ_NATS_URL (default the
machine's nats://127.0.0.1:4222, shared: nothing here stops or purges anything it
did not make), named ONCEQ_BENCH_<label>_<random>, and deletes them afterwards
(`temp_stream`), with their dead-letter stream S_DEAD that `onceq nats setup` makes.

onceq is run through its CLI only (`python -m onceq nats …`), with this interpreter
or the one given by --onceq-python (another venv: e.g. a branch's before it is
merged). The ceilings are nats-py used directly in the bench process, configured as
`onceq nats setup` configures a flow: a work-queue stream on file storage, a durable
pull consumer with explicit acks.

Figures come from evidence the run leaves behind: the ledger's `messages.processed_at`
(one stamp per commit; the ceiling writes the same row), the stub's /_stats, the
stream's and consumer's state as the server reports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import mq_common as mc

URL = os.environ.get("ONCEQ_NATS_URL") or "nats://127.0.0.1:4222"
ID_FIELD = "guid"  # the claims' id (mq_common.write_claims), --id-field of onceq's side


def _port() -> int:
    return int(URL.rsplit(":", 1)[1].split("/")[0]) if URL.count(":") >= 2 else 4222


# --- the server ---------------------------------------------------------------------------


async def _connect() -> Any:
    import nats

    async def quiet(exc: Exception) -> None:  # the bench says it in one line instead
        pass

    return await nats.connect(URL, connect_timeout=5, allow_reconnect=False, error_cb=quiet)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def require_server() -> str:
    """The server's version; exits with one line when JetStream does not answer."""

    async def info() -> str:
        nc = await _connect()
        try:
            await nc.jetstream().account_info()
            return str(nc._server_info.get("version", "?"))
        finally:
            await nc.close()

    try:
        return str(run(asyncio.wait_for(info(), 20)))
    except Exception as exc:
        sys.exit(f"bench: JetStream does not answer at {URL}: {type(exc).__name__}: {exc}")


def machine(version: str) -> str:
    return (
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; python {platform.python_version()},"
        f" {os.cpu_count()} cpu(s) {platform.machine()}, nats-server {version} at {URL}"
        f" (loopback, shared); load average {os.getloadavg()[0]:.1f}"
    )


def server_cpu() -> float | None:
    """CPU seconds of the nats-server listening on URL's port, None when not found. The
    shared server serves other work too: read its figure as an upper bound."""
    port = str(_port())
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"nats-server") and port.encode() in argv:
            return mc.process_cpu(int(pid))
    return None


# --- streams of our own --------------------------------------------------------------------


@dataclass(frozen=True)
class Stream:
    name: str
    subject: str
    durable: str


async def add_stream(s: Stream, consumer: bool = True, max_ack_pending: int = 1000) -> None:
    """The stream (and its durable pull consumer) as `onceq nats setup` makes them."""
    from nats.js import api

    nc = await _connect()
    try:
        js = nc.jetstream()
        await js.add_stream(
            name=s.name,
            subjects=[s.subject],
            retention=api.RetentionPolicy.WORK_QUEUE,
            storage=api.StorageType.FILE,
        )
        if consumer:
            await js.add_consumer(
                s.name,
                durable_name=s.durable,
                ack_policy=api.AckPolicy.EXPLICIT,
                filter_subject=s.subject,
                ack_wait=30,
                max_ack_pending=max_ack_pending,
            )
    finally:
        await nc.close()


async def delete_streams(*names: str) -> None:
    import nats.js.errors

    nc = await _connect()
    try:
        js = nc.jetstream()
        for name in names:
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await js.delete_stream(name)
    finally:
        await nc.close()


@contextlib.contextmanager
def temp_stream(label: str) -> Iterator[Stream]:
    """Unique names (nothing made yet); the stream and S_DEAD deleted afterwards."""
    tag = uuid.uuid4().hex[:8]
    s = Stream(f"ONCEQ_BENCH_{label}_{tag}", f"onceq.bench.{label}.{tag}", f"d{tag}")
    try:
        yield s
    finally:
        run(delete_streams(s.name, f"{s.name}_DEAD"))


async def state(s: Stream) -> tuple[int, int, int]:
    """(messages in the stream, the consumer's pending, its ack-pending)."""
    nc = await _connect()
    try:
        js = nc.jetstream()
        messages = (await js.stream_info(s.name)).state.messages
        ci = await js.consumer_info(s.name, s.durable)
        return int(messages), int(ci.num_pending or 0), int(ci.num_ack_pending or 0)
    finally:
        await nc.close()


async def fill(s: Stream, paths: list[Path], window: int = 256) -> None:
    """Queue the claim files (set-up, not measured): Nats-Msg-Id = guid, every PubAck."""
    nc = await _connect()
    try:
        js = nc.jetstream(publish_async_max_pending=window)
        futures = []
        for p in paths:
            body = p.read_bytes()
            headers = {"Nats-Msg-Id": json.loads(body)[ID_FIELD]}
            futures.append(await js.publish_async(s.subject, body, headers=headers))
        acks = await asyncio.gather(*futures)
        if len(acks) != len(paths) or any(a.duplicate for a in acks):
            sys.exit(f"bench: set-up stored {len(acks)} of {len(paths)} (or duplicates)")
    finally:
        await nc.close()


# --- onceq, through its CLI --------------------------------------------------------------


def onceq_python(path: str | None) -> str:
    """The interpreter that runs onceq's side; exits when it has no `onceq nats`."""
    python = path or sys.executable
    done = subprocess.run(
        [python, "-m", "onceq", "nats", "--help"],
        capture_output=True, text=True, env=env(), check=False,
    )  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"bench: {python} -m onceq nats --help exited {done.returncode}: no NATS CLI")
    return python


def env() -> dict[str, str]:
    return {**os.environ, "ONCEQ_NATS_URL": URL}


def onceq(python: str, *args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [python, "-m", "onceq", *args],
        capture_output=True, text=True, env=env(), timeout=timeout, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"bench: onceq {' '.join(args[:2])} exited {done.returncode}: {done.stderr}")
    return done


def setup(python: str, s: Stream) -> None:
    onceq(python, "nats", "setup", "--stream", s.name, "--subject", s.subject,
          "--durable", s.durable)  # fmt: skip


# --- the ledger's evidence -------------------------------------------------------------------


def messages_count(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as c:
            return int(c.execute("SELECT count(*) FROM messages").fetchone()[0])
    except sqlite3.OperationalError:  # the schema is not there yet
        return 0


def messages_span(db: Path) -> mc.Span:
    """mq_common.ledger_span over `messages.processed_at` (onceq's ledger row)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
        stamps = sorted(
            datetime.fromisoformat(r[0]) for r in c.execute("SELECT processed_at FROM messages")
        )
    first, last = stamps[0], stamps[-1]
    at_first = sum(1 for s in stamps if s == first)
    seconds = (last - first).total_seconds()
    return mc.Span(len(stamps), len(stamps) - at_first, seconds, len(set(stamps)))


def ledger_ddl() -> str:
    """onceq's `messages` table, verbatim from the schema: the ceiling writes the same row."""
    from onceq._ledger.schema import SCHEMA

    (ddl,) = [s for s in SCHEMA.split(";") if "EXISTS messages (" in s]
    return ddl
