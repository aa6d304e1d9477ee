"""1, 2, 4 … consumer processes on one PostgreSQL ledger: throughput and who takes the CPU.

    python bench/scale.py [--messages 6000] [--consumers 1,2,4] [--prefetch 5]
                          [--delay 0] [--rounds 1]

For each number of consumers k, in one vhost, against one claim stub (`onceq partner
claim --delay 0`: a fast partner) and a new PostgreSQL database:

1. n claims are queued; the stub is put on hold (`POST /_hold`: every call waits);
2. k `onceq mq consume --claim … --db postgresql://… --prefetch P` processes start;
   each takes P deliveries and calls the stub, where they wait. When the stub holds
   k × P calls every consumer is connected, consuming and past its start-up;
3. the window opens: CPU counters are read, the stub is released (`/_release`);
4. the window closes when the ledger holds 90 % of n (before the queue's tail, where
   consumers run out of work one by one); CPU counters are read again;
5. the consumers finish the rest and get SIGTERM; the run counts only when every claim
   is in the ledger once, the stub answered one 201 per claim and claim.in is empty.

Throughput = ledger rows committed in the window / its length. CPU: user + system
seconds from /proc/PID/stat, at the window's ends, of the broker (beam.smp), the stub,
PostgreSQL (the ledger database's backends, the shared walwriter, checkpointer …, and
the postmaster; other databases' backends are not the ledger's work), the k
consumers and this bench (it polls the ledger's count every 50 ms over one
connection); the machine's total and idle from /proc/stat. Each is shown as a share of
the machine (100 % = every core busy for the whole window) and as CPU ms per message,
which says what each part would need on a host of its own. Also shown: the
PostgreSQL sessions each consumer holds (pg_stat_activity during the window).
No target: the figures are read in BENCHMARKS.md. Exits 1 when a run is not exact.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mq_common as mc
import pg_common as pc

WINDOW_END = 0.9  # the window closes at this fraction of n
HOLD_TIMEOUT = 60.0  # seconds for every consumer to be holding its prefetch of calls
POLL = 0.05

Procs = list[tuple[subprocess.Popen[str], Path]]  # a consumer and its stderr file


def stub_pid(base: str) -> int:
    """The pid of the stub listening at `base` (mq_common.stub started it)."""
    port = base.rsplit(":", 1)[1]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"partner" in argv and b"claim" in argv and port.encode() in argv:
            return int(pid)
    sys.exit(f"bench: no stub process found for {base}")


def broker_pids() -> list[int]:
    """The broker's Erlang VM: a beam.smp that is not a `rabbitmqctl` (also a beam.smp,
    started by anything that asks the broker something, and gone a second later)."""
    out = []
    for pid in _pids_named("beam.smp"):
        with contextlib.suppress(OSError):
            if b"rabbitmqctl" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
    return out


def _pids_named(comm: str) -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if f"({comm})" in stat:
            out.append(int(pid))
    return out


def machine_cpu() -> tuple[float, float]:
    """(busy, idle) CPU seconds of the whole machine since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    # user nice system idle iowait irq softirq steal (guest is inside user already)
    idle = fields[3] + fields[4]
    busy = sum(fields[:8]) - idle
    hz = os.sysconf("SC_CLK_TCK")
    return busy / hz, idle / hz


@dataclass
class Snapshot:
    at: float
    groups: dict[str, dict[int, float]]
    own: float
    busy: float
    idle: float


def snapshot(groups: dict[str, list[int]]) -> Snapshot:
    at = time.perf_counter()
    busy, idle = machine_cpu()
    return Snapshot(
        at,
        {g: {pid: mc.process_cpu(pid) for pid in pids} for g, pids in groups.items()},
        mc.own_cpu(),
        busy,
        idle,
    )


def spent(a: Snapshot, b: Snapshot, group: str) -> float:
    """CPU seconds a group used between two snapshots (a process born between: all of it)."""
    total = 0.0
    for pid, now in b.groups[group].items():
        if now == now:  # NaN: it ended before the second snapshot
            total += now - a.groups.get(group, {}).get(pid, 0.0)
    return total


@dataclass
class ScaleRun:
    consumers: int
    rows: int  # committed in the window
    seconds: float
    cpu: dict[str, float] = field(default_factory=dict)  # group → CPU seconds in the window
    busy: float = 0.0
    idle: float = 0.0
    sessions: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


def start_consumers(
    k: int, vhost: mc.Vhost, claim: str, url: str, prefetch: int, work: Path
) -> Procs:
    procs = []
    for i in range(k):
        log = work / f"consumer-{k}-{i}.stderr"
        cmd = [sys.executable, "-m", "onceq", "mq", "consume", "--claim", claim, "--db", url,
               "--prefetch", str(prefetch), "--json", "--max-seconds", "600"]  # fmt: skip
        with log.open("w") as err:  # a file: nobody reads a pipe while the bench polls
            proc = subprocess.Popen(
                cmd, env=vhost.env(), stdout=subprocess.PIPE, stderr=err, text=True
            )
        procs.append((proc, log))
    return procs


def stop_consumers(procs: Procs) -> list[dict[str, Any]]:
    for proc, _ in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    summaries = []
    for proc, log in procs:
        out, _ = proc.communicate(timeout=60)
        if proc.returncode != 0:
            sys.exit(f"bench: a consumer exited {proc.returncode}: {log.read_text()[-2000:]}")
        summaries.append(json.loads(out))
    return summaries


def wait_for(what: str, done: Callable[[], bool], timeout: float, procs: Procs) -> None:
    """Poll `done` until true; a consumer that ends meanwhile, or the timeout, ends the bench."""
    deadline = time.monotonic() + timeout
    while not done():
        dead = [log for proc, log in procs if proc.poll() is not None]
        if dead:
            tail = dead[0].read_text()[-2000:]
            sys.exit(f"bench: a consumer ended while waiting for {what}: {tail}")
        if time.monotonic() > deadline:
            sys.exit(f"bench: {what} did not happen within {timeout:.0f}s")
        time.sleep(POLL)


def scale_once(
    k: int, n: int, prefetch: int, vhost: mc.Vhost, claim: str, work: Path, stub: int
) -> ScaleRun:
    import httpx

    mc.publish(vhost, mc.write_claims(work / f"claims-{k}-{time.monotonic_ns()}", n, f"k{k}"))
    mc.stub_reset(claim)
    httpx.post(f"{claim}/_hold", trust_env=False).raise_for_status()
    with pc.temp_database(f"scale{k}") as url:
        procs = start_consumers(k, vhost, claim, url, prefetch, work)
        try:
            wait_for(
                f"{k} x {prefetch} calls held",
                lambda: mc.stub_stats(claim)["held"] >= k * prefetch,
                HOLD_TIMEOUT,
                procs,
            )
            groups = {
                "broker": broker_pids(),
                "stub": [stub],
                "postgres": pc.server_pids(url),
                "consumers": [p.pid for p, _ in procs],
            }
            sessions = pc.sessions(url)
            a = snapshot(groups)
            httpx.post(f"{claim}/_release", trust_env=False).raise_for_status()
            end = int(n * WINDOW_END)
            wait_for(f"{end} rows", lambda: pc.ledger_count(url) >= end, 600, procs)
            groups["postgres"] = pc.server_pids(url)  # a backend forked in the window counts
            b = snapshot(groups)
            rows = pc.ledger_count(url)
            wait_for(f"all {n} rows", lambda: pc.ledger_count(url) >= n, 600, procs)
        finally:
            summaries = stop_consumers(procs)
        if pc.ledger_count(url, "messages") != n or pc.ledger_count(url) != n:
            sys.exit(f"bench: {k} consumers: the ledger holds {pc.ledger_count(url)} of {n}")
    mc.check_drained(vhost, claim, n, f"{k} consumers")
    processed = sum(int(s.get("stats", s)["processed"]) for s in summaries)
    if processed != n:
        sys.exit(f"bench: {k} consumers processed {processed} in all, not {n}")
    run = ScaleRun(k, rows, b.at - a.at, busy=b.busy - a.busy, idle=b.idle - a.idle)
    run.cpu = {g: spent(a, b, g) for g in groups}
    run.cpu["bench"] = b.own - a.own
    run.sessions = sessions
    return run


def report(runs: list[ScaleRun], cpus: int) -> None:
    one = runs[0].rate
    groups = ("consumers", "postgres", "broker", "stub", "bench")
    print()
    header = ("consumers", "msg/s", "x 1", *(f"{g} %" for g in groups), "other %", "idle %")
    rows = []
    for r in runs:
        cap = r.seconds * cpus
        known = sum(r.cpu[g] for g in groups)
        rows.append(
            (
                str(r.consumers),
                f"{r.rate:.0f}",
                f"{r.rate / one:.2f}",
                *(f"{100 * r.cpu[g] / cap:.0f}" for g in groups),
                f"{100 * max(r.busy - known, 0.0) / cap:.0f}",
                f"{100 * r.idle / cap:.0f}",
            )
        )
    mc.table(header, rows)
    print(f"(% of the machine: {cpus} cores x the window; other = busy - the named processes)")
    print()
    mc.table(
        ("consumers", "window", *(f"{g} ms/msg" for g in groups[:4]), "PG sessions"),
        [
            (
                str(r.consumers),
                f"{r.rows}/{r.seconds:.2f}s",
                *(f"{1000 * r.cpu[g] / r.rows:.3f}" for g in groups[:4]),
                ", ".join(f"{name or '(none)'} {n}" for name, n in sorted(r.sessions.items())),
            )
            for r in runs
        ],
    )
    print("(CPU ms per message committed in the window; PG sessions: pg_stat_activity of")
    print(" the ledger's database before the release, by application_name)")
    last = runs[-1]
    print("\nwhat each part could carry on a host of its own (cores x 1000 / its ms per msg,")
    print(f"from the {last.consumers}-consumer run):")
    for g in ("postgres", "broker", "stub"):
        ms = 1000 * last.cpu[g] / last.rows
        print(f"  {g:<9} {ms:.3f} ms/msg -> {cpus * 1000 / ms:>8.0f} msg/s on {cpus} cores")
    per = 1000 * last.cpu["consumers"] / last.rows
    print(f"  consumer  {per:.3f} ms/msg -> {1000 / per:>8.0f} msg/s per core (one process each)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--messages", type=int, default=6000, help="claims per run")
    ap.add_argument("--consumers", default="1,2,4", help="numbers of consumer processes")
    ap.add_argument("--prefetch", type=int, default=5, help="onceq mq consume --prefetch")
    ap.add_argument("--delay", type=float, default=0.0, help="the stub's latency, seconds")
    ap.add_argument("--rounds", type=int, default=1, help="runs per k; the fastest is shown")
    args = ap.parse_args()
    try:
        ks = [int(x) for x in args.consumers.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--consumers: a list of integers, not {args.consumers!r}")
    if not ks or min(ks) < 1 or args.messages < 2 * max(ks) * args.prefetch:
        ap.error("--consumers: at least 1 each, and --messages >= 2 x consumers x prefetch")
    pc.require_pg()
    cpus = os.cpu_count() or 1
    print(mc.machine())
    print(pc.server())
    print(f"{args.messages} claims per run, stub --delay {args.delay:g}, prefetch {args.prefetch}")
    runs: list[ScaleRun] = []
    with (
        tempfile.TemporaryDirectory(prefix="onceq-bench-") as tmp,
        mc.temp_vhost("scale") as vhost,
        mc.stub(args.delay) as claim,
    ):
        mc.topology(vhost)
        stub = stub_pid(claim)
        best: dict[int, ScaleRun] = {}
        for r in range(args.rounds):
            for k in ks if r % 2 == 0 else ks[::-1]:  # alternate the order between rounds
                run = scale_once(k, args.messages, args.prefetch, vhost, claim, Path(tmp), stub)
                print(f"  round {r + 1}, {k} consumer(s): {run.rate:.0f} msg/s", flush=True)
                if k not in best or run.rate > best[k].rate:
                    best[k] = run
        runs = [best[k] for k in ks]
    report(runs, cpus)
    print(f"\nload average now {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
