"""Consumer throughput against a slow claim system, as a fraction of prefetch/latency.

    python bench/mq_consume_fraction.py [--messages 500] [--delay 0.05] [--prefetch 5]
                                        [--compare PATH]

With the stub answering each call after `delay` seconds and at most `prefetch`
deliveries unacked, no consumer can beat prefetch/delay messages per second
(5 / 0.05 = 100 msg/s). This runs, in a temporary vhost:

- onceq: `onceq mq consume --prefetch 5` (calls overlap up to prefetch);
- baseline: one message at a time, the same command with `--prefetch 1`
  (what a consumer that handles one delivery before taking the next gets);
- ceiling: a bare aiormq + aiohttp consumer with the same prefetch doing the same
  durable work (each 201 recorded in a grouped SQLite commit, then one multiple ack
  per group: mq_common.bare_consumer): what the stub, the broker and the client
  libraries allow, so `of ceil` is the part of the gap onceq can close;

each over the same number of queued claims, and prints both as a fraction of the
prefetch-5 limit (and of their own limit, prefetch/delay).

How it is measured: the claims are published BEFORE the consumer starts; the
consumer runs until its ledger holds every claim, then gets SIGTERM. The rate is
taken from the ledger's processed_at column (stamped at each commit): messages
committed after the first commit, divided by the time from the first commit to
the last — so start-up (interpreter, connect, first call) is not counted. The run
is only accepted when the broker's claim.in is empty with nothing unacked and the
stub answered exactly one 201 per claim. The stub's own capacity at the same
concurrency is probed first (aiohttp, as onceq; no broker) to show it is not the
limit. `CPU ms/msg` is the consumer process's CPU per message from its first commit
to its last (start-up excluded). Exits 1 when the target is missed.

--compare PATH runs the onceq consumer a second time with the checkout at PATH (its
interpreter, its code; see bench/compare.py): before/after in one run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import compare
import mq_common as mc


def consume_once(
    vhost: mc.Vhost,
    claim: str,
    work: Path,
    n: int,
    prefetch: int,
    label: str,
    checkout: compare.Checkout | None = None,
) -> mc.ConsumerRun:
    mc.publish(vhost, mc.write_claims(work / f"claims-{label}", n, label))
    mc.stub_reset(claim)
    if label == "ceil":
        run = mc.bare_consumer(vhost, claim, n, prefetch)
    else:
        run = mc.run_consumer(vhost, claim, work / f"{label}.db", n, prefetch, checkout=checkout)
    mc.check_drained(vhost, claim, n, label)
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--messages", type=int, default=500)
    ap.add_argument("--delay", type=float, default=0.05, help="stub latency, seconds")
    ap.add_argument("--prefetch", type=int, default=5)
    ap.add_argument("--target", type=float, default=0.8, help="required fraction of the limit")
    compare.add_argument(ap)
    args = ap.parse_args()
    n, delay, prefetch = args.messages, args.delay, args.prefetch
    limit = prefetch / delay
    other = compare.open_checkout(args.compare) if args.compare else None

    print(mc.machine())
    print(f"{n} claims per run, stub --delay {delay:g}, limit prefetch/delay = {limit:.0f} msg/s")
    this = compare.here()
    print(f"onceq {this.label}", end="")
    print(f", --compare {other.label} ({other.python})" if other else "")
    with (
        tempfile.TemporaryDirectory(prefix="onceq-bench-") as tmp,
        mc.temp_vhost("fraction") as vhost,
        mc.stub(delay) as claim,
    ):
        work = Path(tmp)
        p = mc.probe(claim, 400, prefetch, "aiohttp")
        print(
            f"stub alone (aiohttp, as onceq), {prefetch} in flight: {p.rate:.1f} req/s"
            f" (its limit {limit:.0f}),"
            f" latency p50 {p.pct(0.5) * 1000:.1f} ms p99 {p.pct(0.99) * 1000:.1f} ms"
        )
        mc.topology(vhost)
        ours = consume_once(vhost, claim, work, n, prefetch, "ours")
        theirs = consume_once(vhost, claim, work, n, prefetch, "other", other) if other else None
        ceil = consume_once(vhost, claim, work, n, prefetch, "ceil")
        base = consume_once(vhost, claim, work, n, 1, "base")

    rows = []
    named = [
        (f"onceq mq consume --prefetch {prefetch}", prefetch, ours),
        *([(f"  the same, {other.label}", prefetch, theirs)] if other and theirs else []),
        (f"ceiling: bare aiormq+aiohttp+SQLite, prefetch {prefetch}", prefetch, ceil),
        ("baseline: --prefetch 1 (one at a time)", 1, base),
    ]
    for label, pf, run in named:
        rows.append(
            (
                label,
                f"{run.span.rate:.1f}",
                f"{run.span.rate / limit:.2f}",
                f"{run.span.rate / (pf / delay):.2f}",
                f"{run.span.rate / ceil.span.rate:.2f}",
                f"{run.span.counted}/{run.span.seconds:.2f}s",
                f"{run.wall:.1f}",
                f"{run.cpu_steady * 1000:.3f}",
            )
        )
    print()
    mc.table(
        ("consumer", "msg/s", f"of {limit:.0f}", "of own limit", "of ceil", "counted/span",
         "wall s", "CPU ms/msg"),
        rows,
    )  # fmt: skip
    print(f"\nratio onceq / baseline: {ours.span.rate / base.span.rate:.1f}x", end="")
    print(f"; this / {other.label}: {ours.span.rate / theirs.span.rate:.2f}" if theirs else "")
    print("(wall s: process start to the last record, start-up included; not used for the target)")
    met = mc.verdict(f"onceq --prefetch {prefetch} fraction of limit", ours.span.rate / limit,
                     args.target, "")  # fmt: skip
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
