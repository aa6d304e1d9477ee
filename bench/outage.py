"""A partner outage: what the circuit breaker costs while open, and how fast it recovers.

    python bench/outage.py [--messages 200] [--down-for 12] [--modes refuse,503]
                           [--no-contrast]

For each outage mode, N claims are queued in a temporary vhost (`onceq mq topology`:
the default policy's retry tiers) and `onceq mq consume` (claims preset, default
policy, breaker on, --prefetch 5) consumes them against `onceq partner claim
--down-for 12 --down-as MODE` — the claim system down for the first 12 s, then up.
Then the same with `--no-breaker` (the default retry tiers alone) and with `--retry
exercise --no-breaker` (the exercise's rule, the issue's measured failure) for
contrast.

What is measured, from evidence outside the consumer:
- CPU while open: the consumer process's CPU seconds (/proc/PID/stat, user + system,
  all threads) from the moment its "breaker open" log line appears to its "breaker
  closed" line, per second of that span;
- return → drained: from the stub's "back up" line to the moment every claim has a
  verdict in the ledger (a `messages` row, or a dead failure);
- calls made: the ledger's failures rows (one per failed call: a refused connection
  never reaches the stub, so its /_stats cannot count them) plus its messages rows;
  the stub's view beside it (201s, calls it turned away);
- dead letters, and that no claim was answered 201 twice (by_guid).
Exits 1 when a breaker run leaves more than 10 claims dead or any claim is answered
201 twice.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import select
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mq_common as mc

LIMIT = 240.0  # a run that has not drained by then is a failure, not a figure


@dataclass
class Lines:
    """A process's output lines as they come, each with the monotonic time it was read."""

    seen: list[tuple[float, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def follow(self, stream: Any) -> threading.Thread:
        def read() -> None:
            for line in stream:
                with self.lock:
                    self.seen.append((time.monotonic(), line.rstrip("\n")))

        t = threading.Thread(target=read, daemon=True)
        t.start()
        return t

    def first(self, text: str) -> float | None:
        with self.lock:
            return next((at for at, line in self.seen if text in line), None)


@dataclass
class Run:
    label: str
    mode: str
    claims: int
    dead: int
    calls: int
    stub_201: int
    stub_turned_away: int
    twice: int  # claims answered 201 more than once
    back_to_drained: float
    drained_s: float  # consumer start → every claim has a verdict
    open_s: float | None = None
    open_cpu: float | None = None
    opened: int = 0

    @property
    def cpu_per_s(self) -> float | None:
        if self.open_s is None or self.open_cpu is None or self.open_s <= 0:
            return None
        return self.open_cpu / self.open_s


def verdicts(db: Path) -> tuple[int, int, int]:
    """(processed, dead, failed calls) in the ledger so far."""
    if not db.exists():
        return 0, 0, 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as c:
            done = c.execute("SELECT count(*) FROM messages").fetchone()[0]
            dead = c.execute(
                "SELECT count(DISTINCT msg_id) FROM failures WHERE action = 'dead'"
            ).fetchone()[0]
            failed = c.execute("SELECT count(*) FROM failures").fetchone()[0]
    except sqlite3.OperationalError:  # the schema is not there yet
        return 0, 0, 0
    return int(done), int(dead), int(failed)


def start_stub(port: int, mode: str, down_for: float) -> tuple[subprocess.Popen[str], Lines]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "onceq", "partner", "claim", "--port", str(port),
         "--down-for", str(down_for), "--down-as", mode],
        stdout=subprocess.PIPE, stderr=None, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], mc.STUB_START_TIMEOUT)
    line = proc.stdout.readline() if ready else ""
    if "listening" not in line:
        proc.kill()
        sys.exit(f"bench: stub not listening within {mc.STUB_START_TIMEOUT}s (said {line!r})")
    lines = Lines()
    lines.follow(proc.stdout)
    return proc, lines


def one_run(label: str, mode: str, n: int, down_for: float, flags: list[str]) -> Run:
    with mc.temp_vhost(f"outage-{mode}") as vhost, tempfile.TemporaryDirectory() as tmp:
        mc.topology(vhost)
        mc.publish(vhost, mc.write_claims(Path(tmp) / "claims", n, tag=mode))
        db = Path(tmp) / "ledger.db"
        port = mc.free_port()
        stub, stub_lines = start_stub(port, mode, down_for)
        err_path = Path(tmp) / "consumer.stderr"
        try:
            with err_path.open("w") as err:
                t0 = time.monotonic()
                consumer = subprocess.Popen(
                    [sys.executable, "-m", "onceq", "mq", "consume", "--claim",
                     f"http://{mc.HOST}:{port}", "--db", str(db), "--json",
                     "--max-seconds", str(LIMIT), *flags],
                    env=vhost.env(), stdout=subprocess.PIPE, stderr=err, text=True,
                )  # fmt: skip
                cpu_at: dict[str, float] = {}
                seen_at: dict[str, float] = {}
                drained_at = None
                while consumer.poll() is None and time.monotonic() - t0 < LIMIT:
                    cpu = mc.process_cpu(consumer.pid)
                    log = err_path.read_text(errors="replace")
                    for key, text in (("open", "breaker open after"), ("closed", "breaker closed")):
                        if key not in seen_at and text in log:
                            seen_at[key], cpu_at[key] = time.monotonic(), cpu
                    done, dead, _ = verdicts(db)
                    if done + dead >= n:
                        drained_at = time.monotonic()
                        break
                    time.sleep(0.05)
                consumer.send_signal(signal.SIGTERM)
                out, _ = consumer.communicate(timeout=60)
            if drained_at is None:
                sys.exit(
                    f"bench: {label}/{mode}: not drained within {LIMIT:g}s (consumer exited"
                    f" {consumer.returncode}): {err_path.read_text()[-2000:]}"
                )
            # Every claim may have its verdict before the partner is back (the exercise's
            # rule dead-letters them all at once): its /_stats answer only once it is up.
            until = time.monotonic() + down_for + 30
            while stub_lines.first("back up") is None and time.monotonic() < until:
                time.sleep(0.1)
            stats = mc.stub_stats(f"http://{mc.HOST}:{port}")
        finally:
            stub.send_signal(signal.SIGTERM)
            try:
                stub.wait(10)
            except subprocess.TimeoutExpired:
                stub.kill()
                stub.wait()
        back_at = stub_lines.first("back up")
        done, dead, failed = verdicts(db)
        summary = json.loads(out) if out.strip() else {}
        log = err_path.read_text(errors="replace")
        run = Run(
            label=label,
            mode=mode,
            claims=n,
            dead=dead,
            calls=failed + done,
            stub_201=int(stats["by_status"].get("201", 0)),
            stub_turned_away=int(stats.get("calls_during_outage", 0)),
            twice=sum(1 for c in stats["by_guid"].values() if c > 1),
            back_to_drained=drained_at - back_at if back_at else float("nan"),
            drained_s=drained_at - t0,
            opened=log.count("breaker open after"),
        )
        if "open" in seen_at and "closed" in seen_at:
            run.open_s = seen_at["closed"] - seen_at["open"]
            run.open_cpu = cpu_at["closed"] - cpu_at["open"]
        if summary.get("processed", 0) + summary.get("recovered", 0) < done:
            print(f"  note: {label}/{mode}: summary {summary}", file=sys.stderr)
        return run


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "–" if x is None else format(x, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--down-for", type=float, default=12.0)
    ap.add_argument("--modes", default="refuse,503", help="comma-separated: refuse,503,hang")
    ap.add_argument("--no-contrast", action="store_true", help="only the breaker runs")
    args = ap.parse_args()
    variants = [("breaker (default)", [])]
    if not args.no_contrast:
        variants += [
            ("--no-breaker", ["--no-breaker"]),
            ("exercise rule", ["--retry", "exercise", "--no-breaker"]),
        ]
    print(mc.machine())
    print(
        f"{args.messages} queued claims; the claim stub down for the first"
        f" {args.down_for:g} s of the run, then up; onceq mq consume --prefetch 5"
    )
    runs = []
    for mode in args.modes.split(","):
        for label, flags in variants:
            run = one_run(label, mode, args.messages, args.down_for, flags)
            runs.append(run)
            print(
                f"  {mode:>6} {label:<18} dead {run.dead:>3}  calls {run.calls:>4}"
                f"  return→drained {fmt(run.back_to_drained, '.1f')} s"
                f"  cpu while open {fmt(run.open_cpu)} s / {fmt(run.open_s, '.1f')} s",
                flush=True,
            )
    header = (
        "outage", "consumer", "dead", "calls made", "201s (twice)", "turned away",
        "opened", "open for", "CPU while open", "CPU/s open", "return → drained",
    )  # fmt: skip
    rows = [
        (
            r.mode,
            r.label,
            str(r.dead),
            str(r.calls),
            f"{r.stub_201} ({r.twice})",
            str(r.stub_turned_away),
            str(r.opened),
            f"{fmt(r.open_s, '.1f')} s" if r.open_s is not None else "–",
            f"{fmt(r.open_cpu)} s" if r.open_cpu is not None else "–",
            f"{fmt(r.cpu_per_s, '.3f')} s/s" if r.cpu_per_s is not None else "–",
            f"{r.back_to_drained:.1f} s" if r.back_to_drained >= 0 else "before the return",
        )
        for r in runs
    ]
    print()
    mc.table(header, rows)
    bad = [r for r in runs if r.twice or (r.label.startswith("breaker") and r.dead > 10)]
    for r in bad:
        print(f"MISSED: {r.mode} {r.label}: {r.dead} dead, {r.twice} answered twice")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
