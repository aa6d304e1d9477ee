"""The PostgreSQL ledger against the SQLite one, each between its ceilings, in one run.

    python bench/pg_ledger.py [--messages 3000] [--dirq-messages 10000] [--rounds 2]
                              [--prefetch 5,20] [--parts mq,dirq] [--compare PATH]

Two parts, each side by side in interleaved rounds (the best of each row shown):

- mq: `onceq mq consume --prefetch 5 --json` with a fast partner (the claim stub,
  `--delay 0`) over n queued claims, once with `--db ./x.db` (SQLite) and once with
  `--db postgresql://…` (a new database per run on the loopback server), and the bare
  aiormq + aiohttp consumer as the ceiling (mq_common.bare_consumer: same libraries
  and prefetch, the same grouped SQLite commit, one multiple ack per group). Rate: the
  ledger's commit stamps, first commit to last (mq_common.ledger_span, start-up
  excluded); a run counts only when claim.in is empty with nothing unacked and the
  stub answered one 201 per claim.
  Target: PostgreSQL >= 0.8 of SQLite. Run at each --prefetch given (default 5, the
  CLI's default, and 20): with 5 in flight and a partner that answers at once a message's
  rate is 5 / the time it takes, so every round trip to PostgreSQL shows; with 20 the
  round trips of different messages overlap and what remains is CPU.
- dirq: `onceq._exercise.dirq_batch.consume_queue` (what `onceq dirq consume` runs) over a
  fresh queue of n messages (one in ten a re-sent id), into SQLite and into PostgreSQL, 1 worker
  and `--workers 2` (`workers=2`), and dirq_throughput's ceiling (the same steps,
  no fsync at all, one process). Rate: messages / wall time of the call, as
  dirq_throughput. Target: PostgreSQL (1 worker) >= 0.5 of SQLite.

Beside each mq rate, the CPU per message of the consumer process and of PostgreSQL
(the run database's backends, read before the consumer stops, plus the shared walwriter,
checkpointer … and the postmaster; /proc/PID/stat): on this machine
the consumer, the broker, the stub and PostgreSQL share the same cores, so where the
CPU goes is what the rates come from. And the messages per group commit (the ledger's
distinct commit stamps): each PostgreSQL commit is one round trip (its transaction
begun with the last COMMIT; two for a session's first group and after a copy already
recorded: BEGIN and the dedup insert, then the rest with the COMMIT), and
each claim batch one more (the in-flight guard: releases, claims and the duplicate
check in one statement), so fewer messages per commit means more of a message's time
waiting on the server. The round trips themselves are counted from outside the consumer:
the kernel's TCP counters of the run database's sessions (`pg_common.flights`: the
server's data segments out ~ its answers, the consumer's in ~ its sends), per message.
The consumer's CPU is shown whole (start-up included) and steady (after its first
commit). PostgreSQL is the server named by ONCEQ_BENCH_PG
(default postgresql://postgres@127.0.0.1:5432/postgres); each run's database is
dropped afterwards. Exits 1 when a target is missed.

--compare PATH runs the PostgreSQL rows a second time with the checkout at PATH (its
interpreter, its code; see bench/compare.py), in the same interleaved rounds:
before/after in one run. Its rows are shown against this checkout's SQLite row.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import compare
import dirq_throughput as dt
import mq_common as mc
import pg_common as pc

# --- mq ---------------------------------------------------------------------------------


@dataclass
class MqRun:
    span: mc.Span
    consumer_cpu: float  # the consumer process (start-up included), or the bench's own
    pg_cpu: float | None = None  # the ledger's server processes over the run (PostgreSQL)
    groups: int | None = None  # group commits (distinct commit stamps): messages per commit
    steady: float = float("nan")  # consumer CPU per message after its first commit
    flights: tuple[int, int] | None = None  # TCP segments to / from PostgreSQL (pc.flights)


def mq_once(
    vhost: mc.Vhost,
    claim: str,
    work: Path,
    n: int,
    prefetch: int,
    key: str,
    checkout: compare.Checkout | None = None,
) -> MqRun:
    """One side over n freshly queued claims (with `checkout`: that checkout's consumer)."""
    mc.publish(vhost, mc.write_claims(work / f"claims-{key}", n, key))
    mc.stub_reset(claim)
    if key.startswith("ceil"):
        run = mc.bare_consumer(vhost, claim, n, prefetch)
        mc.check_drained(vhost, claim, n, key)
        return MqRun(run.span, run.cpu, steady=run.cpu_steady)
    if key.startswith("sqlite"):
        run = mc.run_consumer(vhost, claim, work / f"{key}.db", n, prefetch)
        mc.check_drained(vhost, claim, n, key)
        return MqRun(run.span, run.cpu, groups=pc.groups(work / f"{key}.db"), steady=run.cpu_steady)
    with pc.temp_database("mq") as url:
        # Read the server's CPU while the consumer's sessions are alive: a backend's
        # counters leave with it. Before: the shared processes (not the CREATE DATABASE's).
        before = pc.server_cpu(url)
        after: dict[int, float] = {}
        segs: list[tuple[int, int]] = []

        def before_stop() -> None:
            after.update(pc.server_cpu(url))
            segs.append(pc.flights(url))

        run = mc.run_consumer(
            vhost, claim, url, n, prefetch, log=work / f"{key}.stderr",
            before_stop=before_stop, checkout=checkout,
        )  # fmt: skip
        mc.check_drained(vhost, claim, n, key)
        if pc.ledger_count(url, "messages") != n:
            sys.exit(f"bench: {key}: the ledger holds {pc.ledger_count(url, 'messages')}/{n}")
        groups = pc.groups(url)
    return MqRun(run.span, run.cpu, pc.cpu_since(before, after), groups, run.cpu_steady, segs[0])


def mq_part(
    n: int, prefetch: int, rounds: int, other: compare.Checkout | None = None
) -> dict[str, MqRun]:
    keys = ["ceil", "sqlite", "pg", *(["pg@other"] if other else [])]
    best: dict[str, MqRun] = {}
    with (
        tempfile.TemporaryDirectory(prefix="onceq-bench-") as tmp,
        mc.temp_vhost("pg") as vhost,
        mc.stub(0.0) as claim,
    ):
        p = mc.probe(claim, 2000, prefetch)
        print(
            f"stub alone (aiohttp client), {prefetch} in flight: {p.rate:.0f} req/s, latency"
            f" p50 {p.pct(0.5) * 1000:.2f} ms p99 {p.pct(0.99) * 1000:.2f} ms"
        )
        mc.topology(vhost)
        for r in range(rounds):
            shift = r % len(keys)  # each round starts one side later (see mq_end_to_end)
            for key in keys[shift:] + keys[:shift]:
                checkout = other if key.endswith("@other") else None
                run = mq_once(vhost, claim, Path(tmp), n, prefetch, f"{key}-{r}", checkout)
                if key not in best or run.span.rate > best[key].span.rate:
                    best[key] = run
    return best


def mq_report(
    best: dict[str, MqRun], n: int, prefetch: int, other: compare.Checkout | None = None
) -> float:
    ceil = best["ceil"].span.rate
    sqlite = best["sqlite"].span.rate

    def row(label: str, key: str) -> tuple[str, ...]:
        run = best[key]
        return (
            label,
            f"{run.span.rate:.0f}",
            f"{run.span.rate / sqlite:.2f}",
            f"{run.span.rate / ceil:.2f}",
            f"{run.span.counted}/{run.span.seconds:.2f}s",
            f"{run.consumer_cpu / n * 1000:.2f}",
            f"{run.steady * 1000:.2f}",
            "–" if run.pg_cpu is None else f"{run.pg_cpu / n * 1000:.2f}",
            "–" if not run.groups else f"{n / run.groups:.1f}",
            "–" if run.flights is None else f"{run.flights[1] / n:.2f}/{run.flights[0] / n:.2f}",
        )

    print()
    mc.table(
        ("mq consume, stub delay 0", "msg/s", "of SQLite", "of ceil", "counted/span",
         "consumer CPU ms/msg", "steady", "postgres CPU ms/msg", "msgs/commit",
         "round trips/msg"),
        [
            row(f"ceiling: bare aiormq+aiohttp+SQLite, prefetch {prefetch}", "ceil"),
            row(f"onceq mq consume --prefetch {prefetch} --db ./x.db (SQLite)", "sqlite"),
            row(f"onceq mq consume --prefetch {prefetch} --db postgresql://…", "pg"),
            *([row(f"  the same, {other.label}", "pg@other")] if other else []),
        ],
    )  # fmt: skip
    print(
        " (consumer CPU: its process, start-up included; the ceiling's: the bench process;"
        " steady: after the first commit; msgs/commit: messages per group commit, from the"
        " ledger's commit stamps;\n  round trips/msg: the server's TCP segments to the"
        " consumer's sessions / the consumer's to the server, per message: pc.flights)"
    )
    if other:
        this_other = best["pg"].span.rate / best["pg@other"].span.rate
        print(f"\nthis / {other.label}, PostgreSQL: {this_other:.2f}")
    return best["pg"].span.rate / sqlite


# --- dirq -------------------------------------------------------------------------------


def dirq_pg(base: Path | str, label: str, n: int, workers: int) -> float:
    """dirq_throughput.measure into a new PostgreSQL database (made and dropped untimed).

    What a --compare child calls (bench/compare.py), `base` then a string."""
    root = dt.make_queue(Path(base) / label, n)
    with pc.temp_database("dirq") as url:
        t0 = time.perf_counter()
        handled = dt.consume(root, url, workers=workers).received
        elapsed = time.perf_counter() - t0
        rows, distinct = pc.ledger_count(url, "messages"), len(set(dt.message_ids(n)))
    done = len(os.listdir(root / "done"))
    if handled != n or done != n or rows != distinct:
        sys.exit(f"bench: dirq into PostgreSQL: handled {handled}, done/ {done}, ledger {rows};"
                 f" expected {n}, {n}, {distinct}")  # fmt: skip
    shutil.rmtree(root)
    return n / elapsed


def dirq_part(n: int, rounds: int, other: compare.Checkout | None = None) -> dict[str, float]:
    base = Path(tempfile.mkdtemp(prefix="onceq-bench-"))

    def remote(workers: int) -> Callable[[str], float]:
        assert other is not None
        return lambda label: float(other.call("pg_ledger", "dirq_pg", str(base), label, n, workers))

    runs: list[tuple[str, Callable[[str], float]]] = [
        ("ceiling", lambda label: dt.measure(base, label, n, dt.ceiling)),
        ("sqlite", lambda label: dt.measure(base, label, n, dt.ours)),
        ("pg", lambda label: dirq_pg(base, label, n, 1)),
        *([("pg@other", remote(1))] if other else []),
        ("sqlite_2", lambda label: dt.measure(base, label, n, dt.ours_2)),
        ("pg_2", lambda label: dirq_pg(base, label, n, 2)),
        *([("pg_2@other", remote(2))] if other else []),
    ]
    best = dict.fromkeys((key for key, _ in runs), 0.0)
    try:
        print(f"directory queue: {n} messages x {rounds} rounds in {base} ({dt.filesystem(base)})")
        for r in range(rounds):
            for i, (key, run) in enumerate(runs):
                best[key] = max(best[key], run(f"r{r}-{i}"))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return best


def dirq_report(best: dict[str, float], other: compare.Checkout | None = None) -> float:
    ceil = best["ceiling"]
    rows = [
        ("ceiling (same steps, no fsync, 1 proc)", "ceiling", "ceiling"),
        ("onceq dirq consume, SQLite", "sqlite", "sqlite"),
        ("onceq dirq consume, PostgreSQL", "pg", "sqlite"),
        *([(f"  the same, {other.label}", "pg@other", "sqlite")] if other else []),
        ("onceq dirq consume --workers 2, SQLite", "sqlite_2", "sqlite_2"),
        ("onceq dirq consume --workers 2, PostgreSQL", "pg_2", "sqlite_2"),
        *([(f"  the same, {other.label}", "pg_2@other", "sqlite_2")] if other else []),
    ]
    print()
    mc.table(
        ("directory queue", "msgs/s", "of SQLite", "of ceil"),
        [
            (label, f"{best[k]:.0f}", f"{best[k] / best[ref]:.2f}", f"{best[k] / ceil:.2f}")
            for label, k, ref in rows
        ],
    )
    if other:
        one, two = best["pg"] / best["pg@other"], best["pg_2"] / best["pg_2@other"]
        print(f"\nthis / {other.label}, PostgreSQL: 1 worker {one:.2f}, --workers 2 {two:.2f}")
    return best["pg"] / best["sqlite"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--messages", type=int, default=3000, help="claims per mq run")
    ap.add_argument("--dirq-messages", type=int, default=10_000, help="files per dirq run")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each row; the best is shown")
    ap.add_argument(
        "--prefetch", default="5,20", help="onceq mq consume --prefetch: one mq table per value"
    )
    ap.add_argument("--parts", default="mq,dirq", help="which parts to run (mq, dirq)")
    ap.add_argument("--mq-target", type=float, default=0.8, help="PostgreSQL / SQLite, mq")
    ap.add_argument("--dirq-target", type=float, default=0.5, help="PostgreSQL / SQLite, dirq")
    compare.add_argument(ap)
    args = ap.parse_args()
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if not parts or parts - {"mq", "dirq"}:
        ap.error(f"--parts: mq, dirq or both, not {args.parts!r}")
    try:
        prefetches = [int(x) for x in args.prefetch.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--prefetch: a list of integers, not {args.prefetch!r}")
    if not prefetches or min(prefetches) < 1:
        ap.error("--prefetch: at least one value, each >= 1")

    other = compare.open_checkout(args.compare) if args.compare else None

    pc.require_pg()
    print(mc.machine())
    print(pc.server())
    print(f"onceq {compare.here().label}; rounds {args.rounds}, best of each shown", end="")
    print(f"; --compare {other.label} ({other.python})" if other else "")
    t0 = time.monotonic()
    met = True
    if "mq" in parts:
        for prefetch in prefetches:
            print(f"\n{args.messages} claims per mq run, stub --delay 0, --prefetch {prefetch}")
            best = mq_part(args.messages, prefetch, args.rounds, other)
            ratio = mq_report(best, args.messages, prefetch, other)
            what = f"mq --prefetch {prefetch}, PostgreSQL / SQLite"
            met = mc.verdict(what, ratio, args.mq_target, "") and met
    if "dirq" in parts:
        print()
        ratio = dirq_report(dirq_part(args.dirq_messages, args.rounds, other), other)
        met = mc.verdict("dirq, PostgreSQL / SQLite", ratio, args.dirq_target, "") and met
    print(f"\n({time.monotonic() - t0:.0f} s; load average now {os.getloadavg()[0]:.1f})")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
