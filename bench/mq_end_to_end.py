"""End-to-end consumer throughput: `onceq mq consume` between a baseline and a ceiling.

    python bench/mq_end_to_end.py [--messages 3000] [--prefetch 50] [--rounds 1]
                                   [--compare PATH]

Both consume the same number of queued claims in a temporary vhost, POST each to
the claim-system stub (`onceq partner claim --delay 0`), record it in SQLite, and
ack only after the record is committed:

- baseline: the sequential consumer a tutorial writes — pika BlockingConnection,
  basic_qos(prefetch_count=1), one delivery at a time: json.loads, POST with
  httpx.Client (keep-alive), INSERT OR IGNORE + commit per message (SQLite's
  default settings: rollback journal, synchronous FULL), then basic_ack;
- onceq: a user's own flow over the same queue, `onceq run FILE --json` (prefetch 50,
  http.concurrency 50 as the ceiling's pool,
  POST to the same URL, the id from the message_id property) as a user runs it (calls
  overlap up to prefetch; outcomes of several messages share one commit; WAL +
  synchronous FULL; ack after the commit); its one record per message is the ledger's
  row, as the ceiling's. The claims preset, `onceq mq consume --claim` (the figure
  issue 19 quotes), is shown below it: it also writes the exercise's `processed` table
  (a second record of each claim), yet measured no slower than the own flow (its
  handler is written for the claims; the own flow's is the generic HTTP effect);
- ceiling: a bare aiormq + aiohttp consumer in the bench process doing the same
  durable work — the same libraries and prefetch, each 201 recorded in a grouped
  SQLite commit (executemany + COMMIT in a thread, WAL, synchronous FULL), then one
  multiple ack per committed group (mq_common.bare_consumer): the best Python does
  for this work, so `of ceil` is the part of the gap onceq's own code makes.

The fast partner's figure is taken at prefetch 50: at 5 a zero-delay stub leaves every
consumer waiting on round trips, and the ratio says little about the consumer's cost.

How it is measured: the claims are queued before each consumer starts. Both
ledgers stamp processed_at at the commit; the rate is the number of messages
committed after the first commit divided by the time from the first commit to
the last, so start-up (interpreter, connect) counts for neither. A run is only
accepted when claim.in is then empty with nothing unacked and the stub answered
one 201 per claim. The stub's own capacity (httpx.AsyncClient, `prefetch` in
flight, no broker) is printed first to show it is not the limit, and the CPU each
consumer used per message beside its rate (both are CPU-bound on 2 cores shared
with the broker and the stub): `CPU ms/msg` over the whole run (onceq's start-up
included), `steady` from its first commit to its last (start-up excluded; the
figure to compare with the ceiling's).
Exits 1 when the target is missed.

--compare PATH runs the onceq consumer a second time with the checkout at PATH (its
interpreter, its code; see bench/compare.py) over its own queued claims: before/after
in one run.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import compare
import mq_common as mc


def sequential(vhost: mc.Vhost, claim: str, db: Path, n: int) -> None:
    """One message at a time: receive, POST, INSERT + COMMIT, ack."""
    import httpx
    import pika

    conn = sqlite3.connect(str(db))
    conn.execute(
        "CREATE TABLE IF NOT EXISTS processed (msg_id TEXT PRIMARY KEY, claim_id TEXT,"
        " processed_at TEXT NOT NULL)"
    )
    conn.commit()
    http = httpx.Client(timeout=10.0, trust_env=False)
    amqp = pika.BlockingConnection(pika.URLParameters(vhost.url))
    done = 0
    try:
        ch = amqp.channel()
        ch.basic_qos(prefetch_count=1)

        def on_message(ch, method, props, body: bytes) -> None:  # type: ignore[no-untyped-def]
            nonlocal done
            doc = json.loads(body)
            r = http.post(
                f"{claim}/v1/claims",
                content=body,
                headers={"Content-Type": "application/json", "Idempotency-Key": props.message_id},
            )
            if r.status_code == 201:
                conn.execute(
                    "INSERT OR IGNORE INTO processed VALUES (?,?,?)",
                    (props.message_id, doc.get("claimId"), datetime.now(UTC).isoformat()),
                )
                conn.commit()
                ch.basic_ack(method.delivery_tag)
            else:
                ch.basic_reject(method.delivery_tag, requeue=not method.redelivered)
            done += 1
            if done >= n:
                ch.stop_consuming()

        ch.basic_consume("claim.in", on_message, auto_ack=False)
        ch.start_consuming()
    finally:
        amqp.close()
        http.close()
        conn.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--prefetch", type=int, default=50, help="onceq mq consume --prefetch")
    ap.add_argument("--target", type=float, default=1.5, help="required ratio vs baseline")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each side, rotated; best shown")
    compare.add_argument(ap)
    args = ap.parse_args()
    n, prefetch = args.messages, args.prefetch
    other = compare.open_checkout(args.compare) if args.compare else None

    print(mc.machine())
    this = compare.here()
    print(f"{n} claims per run, stub --delay 0; onceq {this.label}", end="")
    print(f", --compare {other.label} ({other.python})" if other else "")
    with (
        tempfile.TemporaryDirectory(prefix="onceq-bench-") as tmp,
        mc.temp_vhost("e2e") as vhost,
        mc.stub(0.0) as claim,
    ):
        work = Path(tmp)
        for c in (1, prefetch):
            p = mc.probe(claim, 2000, c)
            print(
                f"stub alone (aiohttp client), {c} in flight: {p.rate:.0f} req/s, latency p50"
                f" {p.pct(0.5) * 1000:.2f} ms p99 {p.pct(0.99) * 1000:.2f} ms"
            )
        mc.topology(vhost)

        def one(key: str, tag: str) -> tuple[mc.Span, float, float]:
            """One side over n freshly queued claims: its span, its CPU seconds (all, and
            per message after its first commit; the baseline's: NaN)."""
            mc.publish(vhost, mc.write_claims(work / f"claims-{tag}", n, tag))
            mc.stub_reset(claim)
            if key == "base":
                cpu0 = mc.own_cpu()
                sequential(vhost, claim, work / f"{tag}.db", n)
                cpu = mc.own_cpu() - cpu0
                mc.check_drained(vhost, claim, n, "baseline")
                return mc.ledger_span(work / f"{tag}.db"), cpu, float("nan")
            if key == "ceil":
                run = mc.bare_consumer(vhost, claim, n, prefetch)
            else:
                checkout = other if key == "other" else None
                run = mc.run_consumer(
                    vhost, claim, work / f"{tag}.db", n, prefetch, checkout=checkout,
                    own=key != "preset",
                )  # fmt: skip
            mc.check_drained(vhost, claim, n, key)
            walls[key] = max(walls.get(key, 0.0), n / run.wall)
            return run.span, run.cpu, run.cpu_steady

        keys = ["base", "ceil", "ours", "preset", *(["other"] if other else [])]
        best: dict[str, tuple[mc.Span, float, float]] = {}
        walls: dict[str, float] = {}
        for r in range(args.rounds):
            # Each round starts one side later, so that no side always follows the same
            # one (a run can find the broker still busy with the previous one's queue).
            shift = r % len(keys)
            for key in keys[shift:] + keys[:shift]:
                span, cpu, steady = one(key, f"{key}-{r}")
                if key not in best or span.rate > best[key][0].rate:
                    best[key] = (span, cpu, steady)

    base, ceil = best["base"][0], best["ceil"][0]

    def row(label: str, key: str) -> tuple[str, ...]:
        span, cpu, steady = best[key]
        return (
            label,
            f"{span.rate:.0f}",
            f"{span.rate / base.rate:.1f}x",
            f"{span.rate / ceil.rate:.2f}",
            f"{span.counted}/{span.seconds:.2f}s",
            f"{cpu / n * 1000:.3f}",
            "-" if steady != steady else f"{steady * 1000:.3f}",  # NaN: not measured
            f"{span.group:.1f}",
        )

    print()
    rows = [
        row("baseline: pika, 1 at a time, commit per message", "base"),
        row(f"ceiling: bare aiormq+aiohttp+SQLite, prefetch {prefetch}", "ceil"),
        row(f"onceq run, own flow, prefetch {prefetch}", "ours"),
        row("  claims preset, mq consume --claim (+ processed table)", "preset"),
    ]
    if other:
        rows.append(row(f"  own flow, {other.label}", "other"))
    header = ("consumer", "msg/s", "vs base", "of ceil", "counted/span", "CPU ms/msg")
    mc.table((*header, "steady", "/commit"), rows)
    print(f"(onceq wall from process start, start-up included: {walls['ours']:.0f} msg/s;")
    print(" CPU ms/msg: the consumer's own process, start-up included for onceq;")
    print(" steady: CPU ms/msg from its first commit to its last;")
    print(" /commit: messages per ledger commit (rows / distinct commit stamps);")
    print(f" best of {args.rounds} round(s) each)")
    ours = best["ours"][0]
    if other:
        print(f"\nthis / {other.label}: {ours.rate / best['other'][0].rate:.2f}")
    met = mc.verdict("onceq / baseline", ours.rate / base.rate, args.target)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
