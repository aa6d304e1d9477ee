"""The claim-system stub's own latency and throughput: it must not be the bottleneck.

    python bench/stub_latency.py [--requests 2000]

Starts `python -m onceq partner claim --delay D` for D = 0 and 0.05 and sends it
`--requests` POSTs of a sample claim with C requests in flight, no broker
involved, through two asyncio clients:

- aiohttp.ClientSession: the cheapest client here and the one onceq's HttpEffect
  uses, so its figure is the closest to the stub's own capacity and the most a
  consumer can get from the stub on this machine;
- httpx.AsyncClient: shown for comparison (the handler used it before measurement
  moved it to aiohttp).

At delay 0 the stub must serve well above what the consumers reach in
bench/mq_end_to_end.py; at delay 0.05 with C in flight the ideal is C / 0.05 req/s
and the latency should stay close to 50 ms. Prints req/s, the fraction of the
ideal (for delay > 0) and latency percentiles. The client runs in the same
2-core machine as the stub, so these are lower bounds of the stub's capacity.
"""

from __future__ import annotations

import argparse
import sys

import mq_common as mc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    args = ap.parse_args()
    n = args.requests

    print(mc.machine())
    print(f"{n} POST /v1/claims per row")
    rows = []
    for delay, levels in ((0.0, (1, 5, 50)), (0.05, (5, 50))):
        with mc.stub(delay) as base:
            for c in levels:
                for client in ("aiohttp", "httpx"):
                    p = mc.probe(base, n if delay == 0 or c > 5 else n // 4, c, client)
                    ideal = f"{p.rate / (c / delay):.2f}" if delay else "-"
                    rows.append(
                        (
                            f"{delay:g}",
                            str(c),
                            client,
                            f"{p.rate:.0f}",
                            ideal,
                            f"{p.pct(0.5) * 1000:.1f}",
                            f"{p.pct(0.99) * 1000:.1f}",
                        )
                    )
    print()
    mc.table(("delay s", "in flight", "client", "req/s", "of ideal", "p50 ms", "p99 ms"), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
