"""End-to-end consumer throughput on NATS JetStream: `onceq nats consume` beside a ceiling.

    python bench/nats_end_to_end.py [--messages 3000] [--prefetch 50] [--rounds 1]
                                     [--onceq-python PATH]

Both consume the same number of queued claims from a work-queue stream of their own
(on ONCEQ_NATS_URL, default the shared nats://127.0.0.1:4222), POST each to the
claim-system stub (`onceq partner claim --delay 0`), record it in an SQLite ledger,
and ack only after the record is committed:

- onceq: `onceq nats setup --stream S --subject SUBJ --durable D`, then
  `onceq nats consume --stream S --durable D --url STUB/v1/claims --id-field guid
  --prefetch N --db LEDGER --until-empty --json`, as a user runs them;
- ceiling: a bare nats-py pull consumer in the bench process doing the same durable
  work in the fewest steps: pull a batch of `prefetch` (a no-wait request on the
  consumer's NEXT subject, the copies taken from a deque its subscription's callback
  fills: nats-py's `fetch` waits for each copy with two tasks and a uuid4, a slower
  ceiling), POST each (concurrently,
  aiohttp, Idempotency-Key = the guid), commit the batch's rows in one transaction
  in a thread (WAL, synchronous FULL: an fsync per batch, as onceq's ledger; the
  row onceq writes, its `messages` table from onceq's own schema), then ack each
  message. No decoding beyond the id, no duplicate check, no retry policy, no
  in-flight guard, no telemetry: `of ceil` is the part of the gap onceq's own code
  makes.

How it is measured: the claims are queued (nats-py, Nats-Msg-Id = guid) before each
consumer starts. Both ledgers stamp processed_at at the commit; the rate is the
messages committed after the first commit over the time from the first commit to the
last, so start-up (interpreter, connect) counts for neither. A run is only accepted
when the stream is then empty, the consumer holds nothing pending or unacked, and the
stub answered one 201 per claim. CPU per message beside each rate: `CPU ms/msg` over
the whole run (onceq's start-up included), `steady` from its first commit to its last
(the figure to compare with the ceiling's); the shared server's CPU per message too
(an upper bound: it serves other work).

--onceq-python PATH runs onceq's side with another interpreter (another venv, e.g. a
branch's before it is merged); `onceq` is whatever that interpreter imports.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import mq_common as mc
import nats_common as nc


def bare_consumer(s: nc.Stream, claim: str, n: int, prefetch: int, db: Path) -> mc.ConsumerRun:
    """The ceiling (see the module's docstring); its span from its ledger's stamps, its
    CPU from this process's counters, steady from the first commit to the last."""
    import aiohttp

    url = f"{claim}/v1/claims"
    conn = sqlite3.connect(str(db), check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(nc.ledger_ddl())
    marks: list[tuple[int, float]] = []  # (rows committed, own CPU) after each commit
    refused: list[int] = []

    def record(rows: list[tuple[str, str]]) -> None:
        stamp = datetime.now(UTC).isoformat()
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT OR IGNORE INTO messages (flow, msg_id, kept, partner_duplicate,"
            " processed_at, source, ref) VALUES ('default', ?, '{}', 0, ?, 'nats', ?)",
            [(i, stamp, ref) for i, ref in rows],
        )
        conn.execute("COMMIT")

    async def run() -> float:
        client = await nc._connect()
        t0 = time.perf_counter()
        try:
            # The pull as bare nats-py does it fastest (as onceq's pull does it):
            # a request for a batch on the consumer's NEXT subject, the copies taken
            # from a deque the subscription's callback fills. fetch() waits for each
            # copy with next_msg, two tasks and a uuid4 per copy: a slower ceiling.
            inbox = client.new_inbox()
            arrived: collections.deque[Any] = collections.deque()
            came = asyncio.Event()

            async def on_msg(msg: Any) -> None:
                arrived.append(msg)
                came.set()

            await client.subscribe(inbox, cb=on_msg)
            next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{s.name}.{s.durable}"

            async def fetch(n: int) -> list[Any]:
                ask = json.dumps({"batch": n, "no_wait": True}).encode()
                await client.publish(next_subject, ask, reply=inbox)
                batch: list[Any] = []
                while len(batch) < n:
                    if not arrived:
                        came.clear()
                        await asyncio.wait_for(came.wait(), 5)
                        continue
                    msg = arrived.popleft()
                    if msg.headers and msg.headers.get("Status"):  # 404: no more now
                        break
                    batch.append(msg)
                return batch

            connector = aiohttp.TCPConnector(limit=prefetch)
            async with aiohttp.ClientSession(connector=connector) as session:

                async def post(msg: Any) -> tuple[Any, str, int]:
                    body = msg.data
                    msg_id = str(json.loads(body)[nc.ID_FIELD])
                    headers = {"Content-Type": "application/json", "Idempotency-Key": msg_id}
                    async with session.post(url, data=body, headers=headers) as r:
                        await r.read()
                        return msg, msg_id, r.status

                committed = 0
                while committed < n:
                    try:
                        batch = await fetch(prefetch)
                    except TimeoutError:
                        batch = []
                    if not batch:
                        sys.exit(f"bench: ceiling: nothing to fetch after {committed}/{n}")
                    done = await asyncio.gather(*(post(m) for m in batch))
                    refused.extend(st for _, _, st in done if st != 201)
                    if refused:  # the bench's stub accepts every claim: anything else is a fault
                        sys.exit(f"bench: ceiling: the stub answered {refused[0]}, not 201")
                    # ref: the delivery's ack subject (stream, consumer, sequences)
                    rows = [(i, m.reply) for m, i, _ in done]
                    await asyncio.to_thread(record, rows)
                    for m, _, _ in done:
                        await m.ack()
                    committed += len(done)
                    marks.append((committed, mc.own_cpu()))
                await client.flush()  # the last acks are on the wire before the clock stops
                return time.perf_counter() - t0
        finally:
            await client.close()

    cpu0 = mc.own_cpu()
    try:
        wall = asyncio.run(run())
    finally:
        conn.close()
    cpu = mc.own_cpu() - cpu0
    (rows0, cpu_first), (rows1, cpu_last) = marks[0], marks[-1]
    steady = (cpu_last - cpu_first) / (rows1 - rows0) if rows1 > rows0 else float("nan")
    return mc.ConsumerRun({"received": n}, nc.messages_span(db), wall, cpu, steady)


def onceq_consumer(
    python: str, s: nc.Stream, claim: str, n: int, prefetch: int, db: Path, limit: float = 150
) -> mc.ConsumerRun:
    """`onceq nats consume … --until-empty --json`; its CPU read from /proc while it runs
    (at its first commit seen and once all n are in), and in total from its rusage."""
    cmd = [python, "-m", "onceq", "nats", "consume", "--stream", s.name,
           "--durable", s.durable, "--url", f"{claim}/v1/claims", "--id-field", nc.ID_FIELD,
           "--prefetch", str(prefetch), "--db", str(db), "--until-empty", "--json",
           "--max-seconds", str(limit)]  # fmt: skip
    log = db.with_suffix(".stderr")
    t0 = time.perf_counter()
    first: tuple[int, float] | None = None
    last: tuple[int, float] | None = None
    kids0 = mc.own_cpu()
    with log.open("w") as err:  # a file, not a pipe nobody reads while we poll
        proc = subprocess.Popen(cmd, env=nc.env(), stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            while proc.poll() is None:
                rows = nc.messages_count(db)
                if first is None and rows > 0:
                    first = (rows, mc.process_cpu(proc.pid))
                if last is None and rows >= n:
                    last = (rows, mc.process_cpu(proc.pid))
                    wall = time.perf_counter() - t0
                time.sleep(0.02)
            out, _ = proc.communicate(timeout=60)
        except BaseException:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            raise
    cpu = mc.own_cpu() - kids0  # the reaped child's user + system time
    if proc.returncode != 0 or nc.messages_count(db) < n or last is None:
        sys.exit(
            f"bench: onceq nats consume exited {proc.returncode} with"
            f" {nc.messages_count(db)}/{n}: {log.read_text()[-2000:]}"
        )
    steady = float("nan")
    if first is not None and last[0] > first[0]:
        steady = (last[1] - first[1]) / (last[0] - first[0])
    return mc.ConsumerRun(json.loads(out), nc.messages_span(db), wall, cpu, steady)


def check_drained(s: nc.Stream, claim: str, n: int, label: str) -> None:
    """The stream holds nothing (work queue: every message acked), the consumer nothing
    pending or unacked, and the stub saw n accepted calls."""
    messages, pending, unacked = nc.run(nc.state(s))
    calls = mc.stub_stats(claim)["by_status"].get("201", 0)
    if messages or pending or unacked or calls != n:
        sys.exit(
            f"bench: {label}: stream {messages}, pending {pending}, unacked {unacked},"
            f" stub 201s {calls}/{n}"
        )


def bare_run(argv: list[str]) -> int:
    """The ceiling alone, as a process (bench/nats_profile.py counts its instructions):
    STREAM DURABLE CLAIM_URL N PREFETCH DB, the stream filled and the stub up already."""
    stream, durable, claim, n, prefetch, db = argv
    bare_consumer(nc.Stream(stream, "", durable), claim, int(n), int(prefetch), Path(db))
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--bare-run"]:
        return bare_run(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--prefetch", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=1, help="runs of each side, rotated; best shown")
    ap.add_argument("--onceq-python", metavar="PATH", help="the interpreter for onceq's side")
    ap.add_argument(
        "--ceiling-only", action="store_true", help="measure the ceiling alone (no onceq side)"
    )
    args = ap.parse_args()
    n, prefetch = args.messages, args.prefetch
    print(nc.machine(nc.require_server()))
    python = None if args.ceiling_only else nc.onceq_python(args.onceq_python)
    print(f"{n} claims per run, stub --delay 0, prefetch {prefetch}; onceq: {python or '-'}")
    keys = ["ceil", *([] if python is None else ["ours"])]
    best: dict[str, tuple[mc.ConsumerRun, float | None]] = {}
    with tempfile.TemporaryDirectory(prefix="onceq-bench-") as tmp, mc.stub(0.0) as claim:
        work = Path(tmp)
        p = mc.probe(claim, 2000, prefetch)
        print(
            f"stub alone (aiohttp client), {prefetch} in flight: {p.rate:.0f} req/s,"
            f" latency p50 {p.pct(0.5) * 1000:.2f} ms p99 {p.pct(0.99) * 1000:.2f} ms"
        )
        for r in range(args.rounds):
            shift = r % len(keys)  # no side always follows the same one
            for key in keys[shift:] + keys[:shift]:
                tag = f"{key}-{r}"
                with nc.temp_stream(key) as s:
                    if key == "ceil":
                        nc.run(nc.add_stream(s))
                    else:
                        assert python is not None
                        nc.setup(python, s)
                    nc.run(nc.fill(s, mc.write_claims(work / f"claims-{tag}", n, tag)))
                    mc.stub_reset(claim)
                    s0 = nc.server_cpu()
                    db = work / f"{tag}.db"
                    if key == "ceil":
                        run = bare_consumer(s, claim, n, prefetch, db)
                    else:
                        assert python is not None
                        run = onceq_consumer(python, s, claim, n, prefetch, db)
                    s1 = nc.server_cpu()
                    check_drained(s, claim, n, key)
                server = None if s0 is None or s1 is None else (s1 - s0) / n
                if key not in best or run.span.rate > best[key][0].span.rate:
                    best[key] = (run, server)

    ceil = best["ceil"][0].span

    def row(label: str, key: str) -> tuple[str, ...]:
        run, server = best[key]
        return (
            label,
            f"{run.span.rate:.0f}",
            f"{run.span.rate / ceil.rate:.2f}",
            f"{run.span.counted}/{run.span.seconds:.2f}s",
            f"{run.cpu / n * 1000:.3f}",
            "-" if run.cpu_steady != run.cpu_steady else f"{run.cpu_steady * 1000:.3f}",
            "?" if server is None else f"{server * 1000:.3f}",
        )

    rows = [row(f"ceiling: bare nats-py pull + aiohttp + SQLite, batch {prefetch}", "ceil")]
    if "ours" in best:
        rows.append(row(f"onceq nats consume --prefetch {prefetch}", "ours"))
    print()
    mc.table(
        ("consumer", "msg/s", "of ceil", "counted/span", "CPU ms/msg", "steady", "server ms/msg"),
        rows,
    )
    print("(CPU ms/msg: the consumer's own process, start-up included for onceq; steady: from")
    print(" its first commit to its last; server: the nats-server's CPU over the run, per")
    print(f" message, an upper bound on a shared server; best of {args.rounds} round(s) each)")
    if "ours" in best:
        ours, ceil_run = best["ours"][0], best["ceil"][0]
        print(f"\nonceq / ceiling: {ours.span.rate / ceil.rate:.2f} of the rate,", end=" ")
        print(f"{ours.cpu_steady / ceil_run.cpu_steady:.2f}x the steady CPU per message")
    return 0


if __name__ == "__main__":
    sys.exit(main())
