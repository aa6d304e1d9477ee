"""Publish rate on NATS JetStream: `onceq nats publish` beside bare nats-py publishers.

    python bench/nats_publish_rate.py [--messages 5000] [--window 256] [--rounds 3]
                                       [--onceq-python PATH]

The same claim files are published into a work-queue stream of the bench's own (on
ONCEQ_NATS_URL, default the shared nats://127.0.0.1:4222), each with Nats-Msg-Id =
its guid and each stored, its PubAck received:

- one at a time: bare nats-py, `await js.publish(…)` per file (one PubAck round trip
  per message): what a tutorial writes;
- ceiling: bare nats-py with a window of `--window` publishes awaiting their PubAck
  (`publish_async`, `publish_async_max_pending=window`), every PubAck then checked
  (stored in this stream, not a duplicate): the best bare version of the same durable
  work, in this process;
- the ceiling as a process: the same text run by `python -c` (wall clock, start-up
  included): what the CLI row is held against;
- onceq: `onceq nats publish FILE… --subject SUBJ --id-field guid --window W --json`
  as a subprocess, wall clock (start-up included).

After each run the stream must hold exactly n messages; it is then deleted and made
again, so every run starts from an empty stream. The sides run interleaved, --rounds
times; the best run of each is compared (other work on a shared machine only slows a
run down), medians beside, with the CPU per message of the client (this process or
the child) and of the server (the shared nats-server: an upper bound).

--onceq-python PATH runs onceq's side with another interpreter (another venv, e.g. a
branch's before it is merged). Its checkout is byte-compiled first if writable, as an
installed package is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mq_common as mc
import nats_common as nc

# Source text: it also runs as a process of its own (`python -c`, the CLI row's
# ceiling), where importing this module would bill it for the bench's imports.
BARE_PUBLISHER = """
import asyncio, json, sys
from pathlib import Path

import nats


async def bare_publish(url, subject, stream, window, paths, id_field="guid"):
    nc = await nats.connect(url, connect_timeout=5)
    try:
        if window <= 1:  # one PubAck awaited per message
            js = nc.jetstream()
            acks = []
            for p in paths:
                body = Path(p).read_bytes()
                headers = {"Nats-Msg-Id": json.loads(body)[id_field]}
                acks.append(await js.publish(subject, body, headers=headers))
        else:
            js = nc.jetstream(publish_async_max_pending=window)
            futures = []
            for p in paths:
                body = Path(p).read_bytes()
                headers = {"Nats-Msg-Id": json.loads(body)[id_field]}
                futures.append(await js.publish_async(subject, body, headers=headers))
            acks = await asyncio.gather(*futures)
        return sum(1 for a in acks if a.stream == stream and not a.duplicate)
    finally:
        await nc.close()


if __name__ == "__main__":
    url, subject, stream, window, *paths = sys.argv[1:]
    sent = asyncio.run(bare_publish(url, subject, stream, int(window), paths))
    print(json.dumps({"published": sent}))
"""
_bare: dict[str, Any] = {"__name__": "bare_publisher"}
exec(compile(BARE_PUBLISHER, "<bare publisher>", "exec"), _bare)  # our own text, above


def in_process(s: nc.Stream, paths: list[Path], window: int) -> None:
    sent = asyncio.run(_bare["bare_publish"](nc.URL, s.subject, s.name, window, paths))
    if sent != len(paths):
        sys.exit(f"bench: bare publisher (window {window}): {sent} of {len(paths)} stored")


def as_process(s: nc.Stream, paths: list[Path], window: int) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BARE_PUBLISHER, nc.URL, s.subject, s.name, str(window),
         *map(str, paths)],
        capture_output=True, text=True, timeout=150, check=False,
    )  # fmt: skip
    if done.returncode != 0 or json.loads(done.stdout)["published"] != len(paths):
        sys.exit(f"bench: bare publisher process exited {done.returncode}: {done.stderr}")


def ours_cli(python: str, s: nc.Stream, paths: list[Path], window: int) -> None:
    done = subprocess.run(
        [python, "-m", "onceq", "nats", "publish", *map(str, paths), "--subject", s.subject,
         "--id-field", nc.ID_FIELD, "--window", str(window), "--json"],
        env=nc.env(), capture_output=True, text=True, timeout=150, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"bench: onceq nats publish exited {done.returncode}: {done.stderr[-2000:]}")


@dataclass(frozen=True)
class Run:
    rate: float
    client_us: float  # CPU of this process and its reaped children, per message
    server_us: float | None  # CPU of the nats-server, per message (shared: an upper bound)


async def _count(s: nc.Stream) -> int:
    client = await nc._connect()
    try:
        return int((await client.jetstream().stream_info(s.name)).state.messages)
    finally:
        await client.close()


def measure(s: nc.Stream, n: int, fn: Callable[[], None]) -> Run:
    c0, s0 = mc.own_cpu(), nc.server_cpu()
    t = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t
    c1, s1 = mc.own_cpu(), nc.server_cpu()
    stored = nc.run(_count(s))
    if stored != n:
        sys.exit(f"bench: the stream holds {stored} messages, expected {n}")
    # A new stream for the next run: every run starts from an empty one.
    nc.run(nc.delete_streams(s.name))
    nc.run(nc.add_stream(s, consumer=False))
    server = None if s0 is None or s1 is None else (s1 - s0) / n * 1e6
    return Run(n / seconds, (c1 - c0) / n * 1e6, server)


def precompiled(python: str) -> str:
    """Byte-compile the onceq that `python` imports, when writable: an installed package
    is compiled, an editable checkout under PYTHONDONTWRITEBYTECODE=1 is not."""
    where = subprocess.run(
        [python, "-c", "import onceq, os; print(os.path.dirname(onceq.__file__))"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    if not where or not os.access(where, os.W_OK):
        return f"onceq at {where or '?'}: not byte-compiled here"
    subprocess.run([python, "-m", "compileall", "-q", where], capture_output=True, check=False)
    return f"onceq at {where}: byte-compiled, as an installed package is"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--window", type=int, default=256, help="publishes awaiting their PubAck")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each side, interleaved")
    ap.add_argument("--onceq-python", metavar="PATH", help="the interpreter for onceq's side")
    ap.add_argument("--ceiling-only", action="store_true", help="measure the bare publishers alone")
    args = ap.parse_args()
    n, window = args.messages, args.window
    print(nc.machine(nc.require_server()))
    python = None if args.ceiling_only else nc.onceq_python(args.onceq_python)
    print(f"{n} claim files per run, Nats-Msg-Id = guid, every PubAck; {args.rounds} round(s)")
    if python:
        print(precompiled(python))
    rows: list[tuple[str, str]] = [
        ("bare nats-py, 1 PubAck awaited per message", "one"),
        (f"ceiling: bare nats-py, window {window}", "ceil"),
        ("ceiling as a process (python -c, wall: start-up included)", "ceil-cli"),
    ]
    if python:
        rows.append((f"onceq nats publish (CLI wall, window {window})", "cli"))
    runs: dict[str, list[Run]] = {k: [] for _, k in rows}
    with tempfile.TemporaryDirectory(prefix="onceq-bench-") as tmp, nc.temp_stream("pub") as s:
        paths = mc.write_claims(Path(tmp), n, "pub")
        nc.run(nc.add_stream(s, consumer=False))
        sides: dict[str, Callable[[], None]] = {
            "one": lambda: in_process(s, paths, 1),
            "ceil": lambda: in_process(s, paths, window),
            "ceil-cli": lambda: as_process(s, paths, window),
        }
        if python:
            sides["cli"] = lambda: ours_cli(python, s, paths, window)
        keys = [k for _, k in rows]
        for r in range(args.rounds):
            shift = r % len(keys)  # no side always follows the same one
            for k in keys[shift:] + keys[:shift]:
                runs[k].append(measure(s, n, sides[k]))

    best = {k: max(r.rate for r in v) for k, v in runs.items()}
    med = {k: statistics.median(r.rate for r in v) for k, v in runs.items()}

    def against(k: str) -> str:
        return "ceil-cli" if k in ("cli", "ceil-cli") else "ceil"

    def cpu(k: str) -> str:
        client = statistics.median(r.client_us for r in runs[k])
        servers = [r.server_us for r in runs[k] if r.server_us is not None]
        return f"{client:.0f} / {statistics.median(servers):.0f}" if servers else f"{client:.0f}"

    print()
    mc.table(
        (
            "publisher",
            "best msg/s",
            "of ceil",
            "median",
            "runs (msg/s)",
            "CPU us/msg client/server",
        ),
        [
            (
                label,
                f"{best[k]:.0f}",
                f"{best[k] / best[against(k)]:.2f}",
                f"{med[k]:.0f}",
                " ".join(f"{r.rate:.0f}" for r in runs[k]),
                cpu(k),
            )
            for label, k in rows
        ],
    )
    print("(of ceil: best against the best of its ceiling; the CLI row against the ceiling as")
    print(" a process; a child's CPU counts as the client's; the server's is an upper bound)")
    if python:
        ratio = best["cli"] / best["ceil-cli"]
        print(f"\nonceq nats publish / ceiling as a process, best runs: {ratio:.2f}")
    print(f"(load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpu(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
