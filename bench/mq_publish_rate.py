"""Publish rate: `onceq mq publish` (windowed confirms) against one confirm per message.

    python bench/mq_publish_rate.py [--messages 5000] [--window 256]

In a temporary vhost with the claims topology, the same claim files are published
three ways, each as persistent, mandatory messages with message_id = guid and
content_type application/json, every one confirmed by the broker:

- baseline: pika BlockingConnection with confirm_delivery(), one basic_publish at
  a time, each waiting for its confirm (the seed's way);
- onceq (library): load_claims + publish(url, claims, window=256), what
  `onceq mq publish` runs, timed inside this process;
- onceq (CLI): `python -m onceq mq publish FILE… --json` as a subprocess, wall
  clock, so the interpreter start-up and imports (~0.3-0.5 s) are included.

Library and baseline are timed the same way: from before the files are read to
after the connection is closed (connect and every confirm included). After each
run the broker must hold exactly n ready messages in claim.in; the queue is then
deleted and declared again (`onceq mq topology`), so every run starts from an
empty, new queue. The target compares the library figure with the baseline; the CLI figure
is printed beside it. Exits 1 when the target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mq_common as mc


def baseline(vhost: mc.Vhost, paths: list[Path]) -> None:
    """One message, one confirm round trip: basic_publish returns after the broker's ack."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(vhost.url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for p in paths:
            body = p.read_bytes()
            guid = json.loads(body)["guid"]
            ch.basic_publish(
                exchange="eai.claim",
                routing_key="claim",
                body=body,
                properties=pika.BasicProperties(
                    delivery_mode=2, message_id=guid, content_type="application/json"
                ),
                mandatory=True,  # an unroutable message raises UnroutableError
            )
    finally:
        conn.close()


def ours_library(vhost: mc.Vhost, paths: list[Path], window: int) -> None:
    from onceq.amqp.publisher import load_claims, publish

    report = asyncio.run(publish(vhost.url, load_claims(paths), window=window))
    assert report.published == len(paths)


def ours_cli(vhost: mc.Vhost, paths: list[Path], window: int) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "onceq", "mq", "publish", *map(str, paths),
         "--window", str(window), "--json"],
        env=vhost.env(), capture_output=True, text=True, timeout=150, check=False,
    )  # fmt: skip
    if done.returncode != 0 or json.loads(done.stdout)["published"] != len(paths):
        sys.exit(f"bench: onceq mq publish exited {done.returncode}: {done.stderr}")


def measure(vhost: mc.Vhost, n: int, fn: object) -> float:
    t = time.perf_counter()
    fn()  # type: ignore[operator]
    seconds = time.perf_counter() - t
    ready, unacked = mc.depth(vhost)
    if ready != n or unacked:
        sys.exit(f"bench: claim.in holds {ready} ready / {unacked} unacked, expected {n}")
    # A fresh claim.in for the next run: after a purge the classic queue's index still
    # holds the purged segments, and publishing into it measured 30-50% slower and far
    # more variable (3,100-5,800 msg/s against 7,500-9,400 into a new queue).
    mc.rabbitmqctl("delete_queue", "-p", vhost.name, "claim.in")
    mc.topology(vhost)
    return n / seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--window", type=int, default=256, help="onceq's confirms in flight")
    ap.add_argument("--rounds", type=int, default=1, help="repeat each side; medians reported")
    ap.add_argument("--target", type=float, default=5.0, help="required ratio vs baseline")
    args = ap.parse_args()
    n, window = args.messages, args.window

    print(mc.machine())
    print(f"{n} claim files per run, persistent + mandatory + confirmed; {args.rounds} round(s)")
    rates: dict[str, list[float]] = {"base": [], "lib": [], "cli": []}
    with tempfile.TemporaryDirectory(prefix="onceq-bench-") as tmp, mc.temp_vhost("pub") as vh:
        paths = mc.write_claims(Path(tmp), n, "pub")
        mc.topology(vh)
        for _ in range(args.rounds):
            rates["base"].append(measure(vh, n, lambda: baseline(vh, paths)))
            rates["lib"].append(measure(vh, n, lambda: ours_library(vh, paths, window)))
            rates["cli"].append(measure(vh, n, lambda: ours_cli(vh, paths, window)))

    med = {k: statistics.median(v) for k, v in rates.items()}
    ref = med["base"]
    print()
    mc.table(
        ("publisher", "msg/s", "ratio", "runs (msg/s)"),
        [
            (label, f"{med[k]:.0f}", f"{med[k] / ref:.1f}x", " ".join(f"{r:.0f}" for r in rates[k]))
            for label, k in (
                ("baseline: pika, 1 confirm awaited per message", "base"),
                (f"onceq publish (library, window {window})", "lib"),
                (f"onceq mq publish (CLI wall, window {window})", "cli"),
            )
        ],
    )
    met = mc.verdict("onceq (library) / baseline", med["lib"] / ref, args.target)
    print(f"(CLI including interpreter start-up: {med['cli'] / ref:.1f}x)")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
