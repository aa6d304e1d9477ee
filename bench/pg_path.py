"""The PostgreSQL ledger's own cost per message in the consume loop, with nothing else.

    python bench/pg_path.py [--messages 3000] [--prefetch 5] [--ledger pg|sqlite]
                            [--rounds 3] [--skip 0]

The consume loop over the in-memory transport with the claims preset's decoder and
SQL effect (the `processed` table) and a call effect that answers at once: what is
left is the ledger's part of a message — on PostgreSQL the in-flight guard's claim
batches (a round trip each, the duplicate check in it) and the group commits (one
round trip each, two for the first), on SQLite its lock file and commits. Printed
per message: the process's CPU (client side only; the event loop and the commit
thread), wall time, messages per commit, and for PostgreSQL the round trips (the
server's TCP segments to the process's sessions: `pg_common.flights`) and the
server's CPU.

For instructions per message run it under callgrind twice with different --messages
(the difference of the totals over the difference of the counts: start-up cancels):
    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p \\
        .venv/bin/python bench/pg_path.py --messages 1500 --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pg_common as pc
from onceq._core.consumer import Consumer
from onceq._core.outcome import Outcome
from onceq._core.transport import Delivery, Kind
from onceq._exercise.presets import CLAIMS
from onceq._exercise.processed_table import PROCESSED_TABLE
from onceq._ledger.target import open_ledger
from onceq._sources.memory import MemoryTransport


def bodies(n: int) -> list[Delivery]:
    out = []
    for i in range(n):
        guid = str(uuid.uuid4())
        doc = {"guid": guid, "claimId": f"CL-{i:06d}", "amount": 1000 + i, "currency": "JPY"}
        out.append(Delivery(json.dumps(doc).encode(), f"r{i}", guid, stable_ref=True))
    return out


JITTER = [0.0]  # --jitter: the call's longest wait, seconds


async def handler(d: Delivery, fields: dict[str, Any]) -> Outcome:
    # A call that answers after a turn of the loop, or after up to --jitter seconds:
    # copies then end at different times and share commits as over a broker (~2 per
    # commit at prefetch 5 against the claim stub) instead of in lockstep.
    await asyncio.sleep(random.random() * JITTER[0])
    return Outcome(Kind.SUCCESS, fields=fields)


def once(target: str, n: int, prefetch: int) -> dict[str, float]:
    ledger = open_ledger(target, "amqp", sql=PROCESSED_TABLE)
    transport = MemoryTransport(bodies(n))
    consumer = Consumer(transport, ledger, CLAIMS.decode, handler, max_in_flight=prefetch)
    pg = pc.is_pg(target)
    before = pc.server_cpu(target) if pg else {}
    after: dict[int, float] = {}
    segs: list[tuple[int, int]] = []

    async def run() -> None:
        real_close = consumer.leases.aclose

        async def aclose() -> None:  # read the sessions' counters while they live
            if pg:
                after.update(pc.server_cpu(target))
                segs.append(pc.flights(target))
            await real_close()

        consumer.leases.aclose = aclose  # type: ignore[method-assign]
        await consumer.run()

    cpu0, t0 = time.process_time(), time.perf_counter()
    try:
        asyncio.run(run())
    finally:
        ledger.close()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    if len(transport.acked) != n:
        sys.exit(f"bench: acked {len(transport.acked)}/{n}")
    out = {"rate": n / wall, "cpu_ms": cpu / n * 1000, "per_commit": n / pc.groups(target)}
    if pg:
        out["pg_ms"] = pc.cpu_since(before, after) / n * 1000
        out["rt"] = segs[0][1] / n
        out["sends"] = segs[0][0] / n
    return out


def profiled(args: Any, r: int, fn: Any) -> dict[str, float]:
    if not args.profile or r != args.rounds - 1:
        return fn()  # type: ignore[no-any-return]
    import cProfile

    prof = cProfile.Profile()
    out = prof.runcall(fn)
    prof.dump_stats(args.profile)
    return out  # type: ignore[no-any-return]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--prefetch", type=int, default=5)
    ap.add_argument("--ledger", default="pg", choices=("pg", "sqlite"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jitter", type=float, default=0.002, help="the call's longest wait (s)")
    ap.add_argument("--profile", help="write a cProfile of the last round to this file")
    args = ap.parse_args()
    JITTER[0] = args.jitter
    if args.ledger == "pg":
        pc.require_pg()
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="onceq-bench-") as tmp:
            if args.ledger == "pg":
                with pc.temp_database("path") as url:
                    out = profiled(args, r, lambda url=url: once(url, args.messages, args.prefetch))
            else:
                db = str(Path(tmp) / "x.db")
                out = profiled(args, r, lambda db=db: once(db, args.messages, args.prefetch))
        shown = "  ".join(f"{k} {v:.3f}" for k, v in out.items())
        print(f"{args.ledger} round {r}: {shown}", flush=True)
    print(f"(load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
