"""What /metrics costs a consumer: the same work with --metrics-port on and off, one run.

    python bench/metrics_cost.py [--messages 10000] [--claims 2000] [--repeat 3]
                                 [--target 0.95] [--scrape-every 1.0]

Two workloads, each measured with metrics off (the baseline), on, and its ceiling:

- directory queue (bench/dirq_throughput.py's work): `onceq._exercise.dirq_batch.consume_queue` of N
  order files, what `onceq dirq consume` runs; on = a Telemetry on a free port (the
  server on the consumer's loop, the folder scan in a thread every 5 s), scraped
  every --scrape-every seconds by another process (faster than Prometheus's usual
  15 s, so the cost is if anything overstated). Ceiling: dirq_throughput's no-fsync loop.
- RabbitMQ (bench/mq_consume_fraction.py's work with the fast stub, --delay 0):
  `onceq mq consume --prefetch 20` until the ledger holds every claim, rate from the
  ledger's commit stamps; on = the same with --metrics-port (the effect histogram is
  observed per call, the broker's depths read every 5 s) and the same scraper.
  Ceiling: the bare aiormq + aiohttp consumer (mq_common.bare_consumer).

Rounds are interleaved (off, on, ceiling, …) and the best of each is kept, so a
burst of load elsewhere on the machine hits each alike. Prints each figure, the
ratio on/off (target >= 0.95) and each against its ceiling; exits 1 when a ratio
misses the target.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import dirq_throughput as dt
import mq_common as mc

SCRAPER = """
import sys, time, urllib.request
port, every = int(sys.argv[1]), float(sys.argv[2])
while True:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    except OSError:
        pass  # not up yet, or gone: the consumer's timing is what matters
    time.sleep(every)
"""


@contextmanager
def scraper(port: int, every: float) -> Iterator[None]:
    """A Prometheus stand-in in a process of its own (its CPU is not the consumer's)."""
    proc = subprocess.Popen([sys.executable, "-c", SCRAPER, str(port), str(every)])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def dirq_run(base: Path, label: str, n: int, metrics: bool, every: float) -> float:
    from onceq._exercise.dirq_batch import consume_queue as consume
    from onceq._ops.telemetry import OpsOptions, Telemetry

    if not metrics:
        return dt.measure(base, label, n, lambda root: consume(root).received)
    port = mc.free_port()
    # The scraper starts before the clock does (measure times the consume only): its
    # interpreter's start-up is no cost of the consumer's.
    with scraper(port, every):
        return dt.measure(
            base,
            label,
            n,
            lambda root: consume(root, telemetry=Telemetry(OpsOptions(metrics_port=port))).received,
        )


def mq_run(
    vhost: mc.Vhost,
    claim: str,
    work: Path,
    n: int,
    prefetch: int,
    label: str,
    how: str,
    every: float,
) -> float:
    mc.publish(vhost, mc.write_claims(work / f"claims-{label}", n, label))
    mc.stub_reset(claim)
    if how == "ceiling":
        run = mc.bare_consumer(vhost, claim, n, prefetch)
    elif how == "on":
        port = mc.free_port()
        with scraper(port, every):
            run = mc.run_consumer(
                vhost, claim, work / f"{label}.db", n, prefetch, extra=("--metrics-port", str(port))
            )
    else:
        run = mc.run_consumer(vhost, claim, work / f"{label}.db", n, prefetch)
    mc.check_drained(vhost, claim, n, label)
    return run.span.rate


def best_of(rounds: int, runs: dict[str, Callable[[str], float]]) -> dict[str, float]:
    best = dict.fromkeys(runs, 0.0)
    for r in range(rounds):
        for key, run in runs.items():
            best[key] = max(best[key], run(f"r{r}-{key}"))
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--messages", type=int, default=10_000, help="directory queue messages")
    ap.add_argument("--claims", type=int, default=2_000, help="RabbitMQ claims per run")
    ap.add_argument("--prefetch", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3, help="rounds; the best of each is kept")
    ap.add_argument("--target", type=float, default=0.95, help="required ratio on/off")
    ap.add_argument("--scrape-every", type=float, default=1.0, help="seconds between scrapes")
    ap.add_argument("--skip-mq", action="store_true", help="the directory queue only")
    args = ap.parse_args()
    every = args.scrape_every
    print(mc.machine())
    base = Path(tempfile.mkdtemp(prefix="onceq-bench-"))
    try:
        print(f"directory queue: {args.messages} messages x {args.repeat} rounds in {base}")
        dirq = best_of(
            args.repeat,
            {
                "off": lambda label: dirq_run(base, label, args.messages, False, every),
                "on": lambda label: dirq_run(base, label, args.messages, True, every),
                "ceiling": lambda label: dt.measure(base, label, args.messages, dt.ceiling),
            },
        )
        mq: dict[str, float] = {}
        if not args.skip_mq:
            mc.require_broker()
            print(f"RabbitMQ: {args.claims} claims x {args.repeat} rounds, stub --delay 0,"
                  f" --prefetch {args.prefetch}")  # fmt: skip
            with mc.temp_vhost("metrics") as vhost, mc.stub(0.0) as claim:
                mc.topology(vhost)
                mq = best_of(
                    args.repeat,
                    {
                        how: (
                            lambda label, how=how: mq_run(
                                vhost, claim, base, args.claims, args.prefetch, label, how, every
                            )
                        )
                        for how in ("off", "on", "ceiling")
                    },
                )
    finally:
        shutil.rmtree(base, ignore_errors=True)

    rows, met = [], True
    for name, best in (("dirq consume", dirq), ("mq consume", mq)):
        if not best:
            continue
        ratio = best["on"] / best["off"]
        met = met and ratio >= args.target
        rows.append((name, f"{best['on']:.0f}", f"{best['off']:.0f}", f"{best['ceiling']:.0f}",
                     f"{ratio:.3f}", f"{best['on'] / best['ceiling']:.2f}"))  # fmt: skip
    print()
    mc.table(("workload", "metrics on msg/s", "off (baseline)", "ceiling", "on/off", "on of ceil"),
             rows)  # fmt: skip
    print(f"(scraped every {every:g} s while on; target on/off >= {args.target})")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
