"""Shared helpers for the RabbitMQ benchmarks (bench/mq_*.py, bench/stub_latency.py).

Every benchmark runs in a vhost of its own that it creates and deletes
(`temp_vhost`), against the claim-system stub started exactly as a user starts it
(`python -m onceq partner claim`, `stub`), and drives onceq through its CLI or
its library, never through private helpers.

Figures come from evidence the run leaves behind, not from the consumer's own
word: the ledger's `processed_at` column (one timestamp per commit), the stub's
/_stats (calls answered) and the broker's queue depth (rabbitmqctl).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import select
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import compare
import pg_common

HOST = "127.0.0.1"
BROKER = (HOST, 5672)
RABBITMQCTL_TIMEOUT = 60
STUB_START_TIMEOUT = 20


# --- the machine ----------------------------------------------------------------------


def rabbitmqctl(*args: str) -> str:
    done = subprocess.run(
        ["rabbitmqctl", "-q", *args],
        capture_output=True,
        text=True,
        timeout=RABBITMQCTL_TIMEOUT,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"bench: rabbitmqctl {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def broker_version() -> str:
    try:
        doc = json.loads(rabbitmqctl("status", "--formatter", "json"))
    except (json.JSONDecodeError, OSError):
        return "RabbitMQ ?"
    return f"RabbitMQ {doc.get('rabbitmq_version', '?')}"


def machine() -> str:
    """One line naming what the figures were measured on."""
    return (
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; python {platform.python_version()},"
        f" {os.cpu_count()} cpu(s) {platform.machine()}, {broker_version()} on"
        f" {BROKER[0]}:{BROKER[1]} (loopback); load average {os.getloadavg()[0]:.1f}"
    )


def require_broker() -> None:
    try:
        socket.create_connection(BROKER, timeout=2).close()
    except OSError:
        sys.exit(f"bench: RabbitMQ does not answer on {BROKER[0]}:{BROKER[1]}")


# --- a vhost of our own -----------------------------------------------------------------


@dataclass(frozen=True)
class Vhost:
    name: str
    url: str

    def env(self) -> dict[str, str]:
        return {**os.environ, "EAI_AMQP_URL": self.url}


@contextlib.contextmanager
def temp_vhost(label: str) -> Iterator[Vhost]:
    """A fresh vhost (guest may do everything in it), deleted with its queues afterwards."""
    require_broker()
    name = f"onceq-bench-{label}-{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_vhost", name)
    try:
        rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        yield Vhost(name, f"amqp://guest:guest@{BROKER[0]}:{BROKER[1]}/{name}")
    finally:
        rabbitmqctl("delete_vhost", name)


def onceq(*args: str, vhost: Vhost, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `python -m onceq ARGS` as a user would; exits the bench if it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "onceq", *args],
        capture_output=True,
        text=True,
        env=vhost.env(),
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"bench: onceq {' '.join(args[:2])} exited {done.returncode}: {done.stderr}")
    return done


def topology(vhost: Vhost) -> None:
    onceq("mq", "topology", vhost=vhost)


def depth(vhost: Vhost, queue: str = "claim.in") -> tuple[int, int]:
    """(ready, unacked) of a queue, as the broker reports it."""
    out = rabbitmqctl(
        "list_queues", "-p", vhost.name, "name", "messages_ready",
        "messages_unacknowledged", "--formatter", "json",
    )  # fmt: skip
    for row in json.loads(out or "[]"):
        if row["name"] == queue:
            return int(row["messages_ready"]), int(row["messages_unacknowledged"])
    sys.exit(f"bench: queue {queue} missing in vhost {vhost.name}")


def purge(vhost: Vhost, queue: str = "claim.in") -> None:
    rabbitmqctl("purge_queue", "-p", vhost.name, queue)


# --- claims -----------------------------------------------------------------------------


def write_claims(folder: Path, n: int, tag: str = "c") -> list[Path]:
    """n claim files shaped like the sample ones (about 300 bytes), each with its own guid."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        doc = {
            "guid": str(uuid.uuid4()),
            "claimId": f"CL-{tag}-{i:06d}",
            "policyNo": f"P-{88000 + i % 997}",
            "insured": "Sato Hanako",
            "amount": 1000 + i,
            "currency": "JPY",
            "docs": ["receipt.pdf", "diagnosis.pdf"],
            "submittedAt": "2026-11-01T09:01:00Z",
        }
        p = folder / f"claim-{tag}-{i:06d}.json"
        p.write_text(json.dumps(doc, indent=2))
        paths.append(p)
    return paths


def publish(vhost: Vhost, paths: list[Path]) -> None:
    """Queue the claims through onceq's publisher (set-up, not measured)."""
    load_claims = compare.internal(
        "onceq._sources.amqp.publisher:load_claims", "onceq.amqp.publisher:load_claims"
    )
    do_publish = compare.internal(
        "onceq._sources.amqp.publisher:publish", "onceq.amqp.publisher:publish"
    )

    report = asyncio.run(do_publish(vhost.url, load_claims(paths)))
    if report.published != len(paths):
        sys.exit(f"bench: set-up published {report.published} of {len(paths)}")


# --- the claim-system stub ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def stub(delay: float) -> Iterator[str]:
    """`python -m onceq partner claim --port P --delay D` on a free port; yields its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "onceq", "partner", "claim", "--port", str(port),
         "--delay", str(delay)],
        stdout=subprocess.PIPE,
        stderr=None,  # inherited: a pipe nobody reads could fill and stall the stub
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], STUB_START_TIMEOUT)
        line = proc.stdout.readline() if ready else ""  # "claim system stub listening on …"
        if "listening" not in line:
            proc.kill()
            sys.exit(f"bench: stub not listening within {STUB_START_TIMEOUT}s (said {line!r})")
        yield f"http://{HOST}:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stub_stats(base: str) -> dict[str, Any]:
    import httpx

    return httpx.get(f"{base}/_stats", trust_env=False).json()


def stub_reset(base: str) -> None:
    import httpx

    httpx.post(f"{base}/_reset", trust_env=False).raise_for_status()


@dataclass(frozen=True)
class Probe:
    requests: int
    concurrency: int
    seconds: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    def pct(self, p: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(p * len(xs)))]


def probe(base: str, n: int, concurrency: int, client: str = "aiohttp") -> Probe:
    """n POSTs of a sample claim with `concurrency` in flight; no broker involved.

    client "aiohttp" (the cheapest asyncio client here, and what onceq's HttpEffect
    uses: it measures the stub) or "httpx" (httpx.AsyncClient, which the handler used
    before measurement moved it to aiohttp: ~5x the CPU per request).
    """
    body = json.dumps({"guid": "probe", "claimId": "CL-probe", "docs": ["a.pdf"]}).encode()
    headers = {"Content-Type": "application/json"}
    url = f"{base}/v1/claims"

    async def run() -> Probe:
        lat: list[float] = []
        todo = iter(range(n))

        async def drive(post: Callable[[], Any]) -> Probe:
            async def worker() -> None:
                for _ in todo:
                    t = time.perf_counter()
                    status = await post()
                    lat.append(time.perf_counter() - t)
                    if status != 201:
                        sys.exit(f"bench: stub answered {status}")

            await asyncio.gather(*(post() for _ in range(concurrency)))  # warm the pool
            lat.clear()
            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return Probe(n, concurrency, time.perf_counter() - t0, lat)

        if client == "httpx":
            import httpx

            c = concurrency
            limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
            async with httpx.AsyncClient(limits=limits, trust_env=False) as hc:

                async def post_httpx() -> int:
                    return (await hc.post(url, content=body, headers=headers)).status_code

                return await drive(post_httpx)
        import aiohttp

        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def post_aiohttp() -> int:
                async with session.post(url, data=body, headers=headers) as r:
                    await r.read()
                    return r.status

            return await drive(post_aiohttp)

    result = asyncio.run(run())
    stub_reset(base)
    return result


# --- consumers and their evidence ------------------------------------------------------


def ledger_count(db: Path | str, table: str = "processed") -> int:
    """Rows in the presets' `processed` table (or onceq's `messages`, an own flow's only
    record): an SQLite file or a PostgreSQL URL."""
    if pg_common.is_pg(db):
        return pg_common.ledger_count(str(db), table)
    db = Path(db)
    if not db.exists():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as c:
            return int(c.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    except sqlite3.OperationalError:  # the schema is not there yet
        return 0


@dataclass(frozen=True)
class Span:
    """Messages recorded after the first commit, over the time to the last commit."""

    rows: int
    counted: int
    seconds: float
    # Distinct commit stamps: the ledger's commits (one stamp per commit), so rows /
    # commits is the mean group (messages per commit) — how well commits were shared.
    commits: int = 0

    @property
    def group(self) -> float:
        return self.rows / self.commits if self.commits else float("nan")

    @property
    def rate(self) -> float:
        return self.counted / self.seconds if self.seconds > 0 else float("nan")


def ledger_span(db: Path | str, column: str = "processed_at", table: str = "processed") -> Span:
    """Steady throughput from the ledger's commit timestamps, start-up excluded.

    The clock starts at the first commit (so connecting, the first delivery and
    the first call are not counted) and stops at the last; the rows committed at
    the first timestamp are not counted either, since their work happened before
    the clock started. `db`: an SQLite file or a PostgreSQL URL (bench/pg_common.py).
    """
    if pg_common.is_pg(db):
        stamps = pg_common.stamps(str(db), column, table)
    else:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
            stamps = [
                datetime.fromisoformat(r[0]) for r in c.execute(f"SELECT {column} FROM {table}")
            ]
    stamps.sort()
    first, last = stamps[0], stamps[-1]
    at_first = sum(1 for s in stamps if s == first)
    return Span(
        len(stamps), len(stamps) - at_first, (last - first).total_seconds(), len(set(stamps))
    )


@dataclass
class ConsumerRun:
    summary: dict[str, Any]
    span: Span
    wall: float  # process start → all n recorded (start-up included)
    cpu: float  # CPU seconds the consumer process had used by then (start-up included)
    # CPU seconds per message recorded after the first commit seen: the steady cost of
    # a message, start-up (interpreter, imports, connect: ~0.1 ms/msg over 3,000) excluded.
    cpu_steady: float = float("nan")


def run_consumer(
    vhost: Vhost,
    claim: str,
    db: Path | str,
    n: int,
    prefetch: int,
    limit: float = 150,
    checkout: compare.Checkout | None = None,
    log: Path | None = None,
    before_stop: Callable[[], None] | None = None,
    extra: tuple[str, ...] = (),
    own: bool = False,
) -> ConsumerRun:
    """`onceq mq consume --json` until the ledger holds n rows, then SIGTERM (a clean stop).

    `own`: a user's own flow over the same queue instead of the claims preset —
    `onceq run FILE` with `OWN_FLOW` (POST to the same URL, the id from the message_id
    property), whose only record is the ledger's `messages` row: the preset also writes
    the exercise's `processed` table, a second record of every claim.

    --max-seconds is only a safety net: a consumer that stalls ends the bench. With a
    checkout (bench/compare.py), that checkout's interpreter and code run it. `db` is
    an SQLite path or a PostgreSQL URL (then `log` names the consumer's stderr file).
    `before_stop` is called once every row is in, while the consumer (and its database
    sessions) still run. `extra`: more options for the command (--metrics-port …).
    """
    python = checkout.python if checkout else sys.executable
    env = checkout.env(vhost.env()) if checkout else vhost.env()
    cmd = [python, "-m", "onceq", "mq", "consume", "--claim", claim,
           "--prefetch", str(prefetch), "--db", str(db), "--json",
           "--max-seconds", str(limit), *extra]  # fmt: skip
    table = "processed"
    if own:
        flow = Path(db).with_suffix(".toml")
        flow.write_text(OWN_FLOW.format(db=db, prefetch=prefetch, url=f"{claim}/v1/claims"))
        cmd = [python, "-m", "onceq", "run", str(flow), "--json",
               "--max-seconds", str(limit), *extra]  # fmt: skip
        table = "messages"
    if log is None:
        log = Path(db).with_suffix(".stderr")
    t0 = time.perf_counter()
    # stderr to a file, not a pipe: nobody reads a pipe while we poll, and a chatty
    # consumer would block on a full one.
    with log.open("w") as err_file:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err_file, text=True)
        # PostgreSQL is polled less often: its count runs on the server under test.
        every = 0.05 if pg_common.is_pg(db) else 0.02
        first: tuple[int, float] | None = None  # (rows, CPU) when a commit is first seen
        while (rows := ledger_count(db, table)) < n and proc.poll() is None:
            if first is None and rows > 0:
                first = (rows, process_cpu(proc.pid))
            time.sleep(every)
        wall = time.perf_counter() - t0
        cpu = process_cpu(proc.pid)
        steady = float("nan")
        if first is not None and n > first[0]:
            steady = (cpu - first[1]) / (n - first[0])
        if before_stop is not None:
            before_stop()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    if proc.returncode != 0 or ledger_count(db, table) < n:
        err = log.read_text()[-2000:]
        got = ledger_count(db, table)
        sys.exit(f"bench: consumer exited {proc.returncode} with {got}/{n}: {err}")
    return ConsumerRun(json.loads(out), ledger_span(db, table=table), wall, cpu, steady)


# A user's own flow over the claims' queue and topology (`onceq mq topology` declared
# them with the preset's names, so the flow names them too), POSTing to the same URL
# with as many connections as deliveries in flight, as the ceiling (TCPConnector(limit=
# prefetch)), `mq consume --url` and the claims preset do. With the flow file's default
# of 5, 45 of 50 calls queued for a connection in aiohttp (a future and two pool scans
# per wait): 1,122k against 1,031k instructions per message (bench/mq_profile.py own).
OWN_FLOW = """
ledger = "{db}"

[flows.claims]
source = "rabbitmq"
queue = "claim.in"
exchange = "eai.claim"
routing_key = "claim"
dead_letter_exchange = "eai.dlx"
dead_letter_queue = "claim.dead"
prefetch = {prefetch}
id_field = "guid"

[flows.claims.http]
url = "{url}"
concurrency = {prefetch}
"""


def bare_consumer(
    vhost: Vhost, claim: str, n: int, prefetch: int, db: Path | None = None
) -> ConsumerRun:
    """The ceiling: the same durable work as onceq's consumer, in the fewest steps Python allows.

    Bare aiormq + aiohttp, `prefetch` deliveries in flight: each POSTed to the stub with
    its Idempotency-Key; the 201s recorded in groups — one executemany INSERT OR IGNORE of
    the ids + COMMIT per group, in a thread (SQLite WAL, synchronous=FULL: an fsync per
    group, as onceq's ledger) — and only after its COMMIT is a group acked, with one
    `multiple` ack for the tags it may cover (none below it still unsettled), the rest one
    by one. So it is what onceq does for this work (ledger commit before ack), minus the
    decoding, the duplicate check, the in-flight guard, the retry policy, telemetry.
    Runs in this process; its span is taken from its ledger's commit stamps (as onceq's),
    its CPU from this process's counters: `cpu` over the whole run, `cpu_steady` from the
    first commit to the last (as `run_consumer`'s).
    """
    import aiohttp
    import aiormq

    refused: list[int] = []
    url = f"{claim}/v1/claims"
    own_db = db is None
    if db is None:
        db = Path(tempfile.mkdtemp(prefix="onceq-bench-bare-")) / "bare.db"
    conn = sqlite3.connect(str(db), check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS processed (msg_id TEXT PRIMARY KEY, processed_at TEXT NOT NULL)"
    )
    marks: list[tuple[int, float]] = []  # (rows committed, own CPU) after each commit

    def record(ids: list[str]) -> None:
        stamp = datetime.now(UTC).isoformat()
        conn.execute("BEGIN")
        conn.executemany("INSERT OR IGNORE INTO processed VALUES (?, ?)", [(i, stamp) for i in ids])
        conn.execute("COMMIT")

    async def run() -> float:
        connection = await aiormq.connect(vhost.url)
        all_in = asyncio.Event()
        done: list[tuple[int, str]] = []  # (tag, id) answered 201, not yet committed
        ready = asyncio.Event()
        out: set[int] = set()  # tags delivered and not yet acked
        committed = 0
        t0 = time.perf_counter()
        try:
            channel = await connection.channel()
            await channel.basic_qos(prefetch_count=prefetch)
            connector = aiohttp.TCPConnector(limit=prefetch)
            async with aiohttp.ClientSession(connector=connector) as session:

                async def on_message(message: Any) -> None:
                    tag = message.delivery_tag
                    out.add(tag)
                    msg_id = message.header.properties.message_id
                    headers = {"Content-Type": "application/json", "Idempotency-Key": msg_id}
                    async with session.post(url, data=message.body, headers=headers) as r:
                        await r.read()
                        status = r.status
                    if status == 201:
                        done.append((tag, msg_id))
                        ready.set()
                    else:  # the bench's stub accepts every claim: anything else is a fault
                        out.discard(tag)
                        await channel.basic_reject(tag, requeue=False)
                        refused.append(status)
                        all_in.set()

                async def committer() -> None:
                    nonlocal committed
                    while committed < n:
                        await ready.wait()
                        ready.clear()
                        group = done[:]
                        done.clear()
                        await asyncio.to_thread(record, [i for _, i in group])
                        committed += len(group)
                        marks.append((committed, own_cpu()))
                        tags = {t for t, _ in group}
                        others = out - tags
                        low = min(others) if others else math.inf
                        covered = [t for t in tags if t < low]
                        if len(covered) > 1:
                            await channel.basic_ack(max(covered), multiple=True)
                        else:
                            covered = []
                        for t in tags.difference(covered):
                            await channel.basic_ack(t)
                        out.difference_update(tags)
                    all_in.set()

                task = asyncio.ensure_future(committer())
                await channel.basic_consume("claim.in", on_message, no_ack=False)
                await asyncio.wait_for(all_in.wait(), 150)
                task.cancel()
                return time.perf_counter() - t0
        finally:
            await connection.close()

    cpu0 = own_cpu()
    try:
        wall = asyncio.run(run())
    finally:
        conn.close()
    cpu = own_cpu() - cpu0
    if refused:
        sys.exit(f"bench: bare consumer: the stub answered {refused[0]}, not 201")
    span = ledger_span(db)
    if own_db:
        shutil.rmtree(db.parent, ignore_errors=True)
    (rows0, cpu_first), (rows1, cpu_last) = marks[0], marks[-1]
    steady = (cpu_last - cpu_first) / (rows1 - rows0) if rows1 > rows0 else float("nan")
    return ConsumerRun({"received": n}, span, wall, cpu, steady)


def check_drained(vhost: Vhost, base: str, n: int, label: str) -> None:
    """The broker holds nothing (every message acked) and the stub saw n accepted calls."""
    ready, unacked = depth(vhost)
    calls = stub_stats(base)["by_status"].get("201", 0)
    if ready or unacked or calls != n:
        sys.exit(f"bench: {label}: queue {ready} ready / {unacked} unacked, stub 201s {calls}/{n}")


# --- CPU accounting -----------------------------------------------------------------------


def own_cpu() -> float:
    """CPU seconds of this process and its finished children (user + system)."""
    import resource

    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) a live process has used, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def broker_cpu() -> float | None:
    """CPU seconds of the local broker's Erlang VM (beam.smp), None when it is not found.

    A `rabbitmqctl` is a beam.smp too (anything asking the broker something, a test
    beside the bench, starts one for a second): the broker is the one that is not.
    """
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if (
                "(beam.smp)" in stat
                and b"rabbitmqctl" not in Path(f"/proc/{pid}/cmdline").read_bytes()
            ):
                return process_cpu(int(pid))
        except OSError:
            continue
    return None


# --- reporting ---------------------------------------------------------------------------


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    for r in (header, *rows):
        cells = [
            r[0].ljust(widths[0]),
            *(c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)),
        ]
        print("  ".join(cells))


def verdict(what: str, value: float, target: float, unit: str = "x") -> bool:
    met = value >= target
    print(
        f"\ntarget: {what} >= {target:g}{unit}: {'MET' if met else 'NOT MET'} ({value:.2f}{unit})"
    )
    return met


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t
