"""Faults on NATS JetStream consumers: kill -9 at random moments, the server killed -9
and restarted mid-run. Each on the test's own server (tests/nats_server.py).

What must hold after every run: 0 lost (the ledger holds every id once, the stream is
empty, the durable consumer has nothing pending and nothing unacked), 0 applied twice
(one ledger row per id), and the partner called again for an id only inside its
commit window: an id committed before a kill is never called after it (its
redelivered copy is acked from the ledger), and every call carries Idempotency-Key =
the id, so a repeated call is one the partner deduplicates. The calls repeated are at
most what the killed processes held (prefetch each).

The seed is printed: a failing run can be repeated (ONCEQ_TEST_SEED).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from mq_support import Partner, claim_doc, partner, wait_for, write_claims
from nats_server import NatsServer, own_nats  # noqa: F401

pytest.importorskip("onceq._sources.nats", reason="the NATS source (issue 21) is not here")
nats = pytest.importorskip("nats")

pytestmark = pytest.mark.slow

STREAM, SUBJECT, DURABLE = "CLAIMS", "claims.in", "onceq"
PREFETCH = 5
# AckWait of the durable consumer: a killed consumer's copies come back after it. Short,
# so a test takes seconds; a live consumer keeps its copies (it says "in progress").
ACK_WAIT = "2"


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onceq", *args],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "ONCEQ_NATS_URL": url},
    )  # fmt: skip


def prepare(url: str, folder: Path, n: int) -> list[str]:
    """The stream and its consumer (`onceq nats setup`), n claims published; their ids."""
    r = cli(url, "nats", "setup", "--stream", STREAM, "--subject", SUBJECT,
            "--durable", DURABLE, "--ack-wait", ACK_WAIT)  # fmt: skip
    assert r.returncode == 0, r.stderr
    guids = [f"g{i:04d}" for i in range(n)]
    files = write_claims(folder, [claim_doc(g) for g in guids])
    r = cli(url, "nats", "publish", *map(str, files), "--subject", SUBJECT, "--id-field", "guid")
    assert r.returncode == 0, r.stderr
    return guids


class Consumers:
    """`onceq nats consume` processes on one ledger, each with its stderr in a file."""

    def __init__(self, url: str, claim: str, db: Path, logs: Path) -> None:
        self.url, self.claim, self.db, self.logs = url, claim, db, logs
        logs.mkdir(exist_ok=True)
        self.live: list[subprocess.Popen[str]] = []
        self.killed = 0
        self.started = 0

    def start(self) -> subprocess.Popen[str]:
        self.started += 1
        err = (self.logs / f"c{self.started}.err").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "onceq", "nats", "consume", "--stream", STREAM,
             "--durable", DURABLE, "--url", f"{self.claim}/v1/claims", "--id-field", "guid",
             "--prefetch", str(PREFETCH), "--db", str(self.db), "--json"],
            stdout=subprocess.PIPE, stderr=err, text=True,
            env={**os.environ, "ONCEQ_NATS_URL": self.url},
        )  # fmt: skip
        err.close()
        self.live.append(proc)
        return proc

    def start_two(self, p: Partner) -> None:
        """Two at once on one durable consumer and one ledger. The second starts once
        the first has made the ledger: two processes making a new SQLite ledger at the
        same instant can be refused (exit 8, "a ledger of another schema"), a race of
        the ledger's opener that is not this test's subject. The partner holds every
        call meanwhile (released by the caller): the first must not finish the work
        alone before the faults begin."""
        p.hold()
        first = self.start()
        wait_for(lambda: first.pid in heartbeats(self.db) or first.poll() is not None, 120)
        assert first.poll() is None, self.stderr()
        self.start()

    def kill(self, proc: subprocess.Popen[str]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        self.live.remove(proc)
        self.killed += 1

    def stop(self) -> list[dict[str, Any]]:
        """SIGTERM every live one: each exits 0 with its JSON summary.

        Only once each has published its heartbeat (its loop runs): a SIGTERM in a
        process's first tens of milliseconds, before onceq's first line, has the
        default action (-15) whatever onceq does, and a consumer restarted just
        before the work ran out may still be there.
        """
        wait_for(lambda: {p.pid for p in self.live} <= heartbeats(self.db), timeout=60, step=0.1)
        summaries = []
        for proc in self.live:
            proc.send_signal(signal.SIGTERM)
        for proc in self.live:
            out, _ = proc.communicate(timeout=90)
            assert proc.returncode == 0, self.stderr()
            summaries.append(json.loads(out))
        self.live = []
        return summaries

    def abort(self) -> None:
        for proc in self.live:
            proc.kill()
            proc.wait()

    def stderr(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.logs.glob("*.err")))[-4000:]


def heartbeats(db: Path, *, connected: bool = False) -> set[int]:
    """The pids of the consumers that have published their state in the ledger (and,
    with `connected`, said their connection to the server is up)."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    except sqlite3.OperationalError:
        return set()
    try:
        rows = conn.execute("SELECT pid, state FROM consumers").fetchall()
    except sqlite3.OperationalError:
        return set()
    finally:
        conn.close()
    return {int(pid) for pid, st in rows if not connected or json.loads(st).get("connected")}


def committed(db: Path) -> list[str]:
    """The ledger's ids, read-only (never creates the file)."""
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return [r[0] for r in conn.execute("SELECT msg_id FROM messages")]
    except sqlite3.OperationalError:  # the schema is being made right now
        return []
    finally:
        conn.close()


def snapshot(db: Path, p: Partner) -> tuple[set[str], Counter[str]]:
    """(ids committed, calls per id) — the ledger read FIRST: a call counted after the
    snapshot for an id committed in it can only have come after that commit."""
    ids = set(committed(db))
    return ids, Counter(p.stats()["by_guid"])


async def _has(js: Any, seq: int) -> int:
    try:
        await js.get_msg(STREAM, seq)
        return 1
    except Exception:
        return 0


async def _state(url: str) -> dict[str, int]:
    nc = await nats.connect(url, connect_timeout=5, allow_reconnect=False)
    try:
        js = nc.jetstream()
        si = (await js.stream_info(STREAM)).state
        ci = await js.consumer_info(STREAM, DURABLE)
        return {
            "messages": int(si.messages),
            "last_seq": int(si.last_seq),
            "pending": int(ci.num_pending or 0),
            "ack_pending": int(ci.num_ack_pending or 0),
            "ack_floor": int(ci.ack_floor.stream_seq if ci.ack_floor else 0),
            # For the failure message: pull requests waiting, copies redelivered.
            "waiting": int(ci.num_waiting or 0),
            "redelivered": int(ci.num_redelivered or 0),
            # For the failure message: is the first unacked copy still in the stream?
            "next_in_stream": await _has(js, int(ci.ack_floor.stream_seq or 0) + 1),
        }
    finally:
        await nc.close()


def state(url: str) -> dict[str, int]:
    """The stream's messages and last sequence; the consumer's pending, ack-pending and
    ack floor (the stream sequence up to which every copy is acked)."""
    import asyncio

    try:
        return dict(asyncio.run(_state(url)))
    except Exception:  # the server restarting: not the state yet
        return {}


def settled(st: dict[str, int], *, empty: bool) -> bool:
    """Every message the stream ever took delivered and acked: nothing pending, nothing
    unacked; with `empty`, the ack floor at the last sequence and the stream empty too
    (work-queue retention deletes an acked message) — not asked after a kill -9 of
    nats-server 2.9: it loses the deletions (and acks) it had not flushed, so a
    restarted server holds acked messages below the ack floor, never delivered again,
    and redelivers those whose acks it lost (the ledger answers them)."""
    if not st or st["pending"]:
        return False
    if empty:
        return st["ack_pending"] == 0 and st["ack_floor"] == st["last_seq"] and not st["messages"]
    # After a kill -9 of nats-server 2.9 the restarted server can also list as
    # ack-pending a copy whose message it had deleted (acked, the deletion flushed, the
    # consumer's ack not): it can never redeliver it, and it stays ack-pending for good
    # (seen: the first unacked sequence no longer in the stream). Accepted here as the
    # server's, when the first unacked sequence is gone from the stream; every id is
    # in the ledger all the same (check()).
    # The ack floor may lag behind too (the consumer's state older than the stream's
    # deletions): nothing pending and nothing unacked is all that can be asked.
    if st["ack_pending"] == 0:
        return True
    return st["ack_pending"] <= 2 * PREFETCH and not st["next_in_stream"]


def drained(url: str, db: Path, *, empty: bool, timeout: float = 60) -> None:
    """Wait until `settled`; say what is left (and what each consumer says it holds)
    when it does not come."""
    try:
        wait_for(lambda: settled(state(url), empty=empty), timeout=timeout, step=0.3)
    except AssertionError:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        try:
            held = conn.execute("SELECT pid, state FROM consumers").fetchall()
        finally:
            conn.close()
        raise AssertionError(f"not settled within {timeout:g}s: {state(url)}; {held}") from None


def check(
    guids: list[str],
    db: Path,
    url: str,
    p: Partner,
    snapshots: list[tuple[set[str], Counter[str]]],
    holders: int,
    empty: bool = True,
) -> Counter[str]:
    """The invariants of the module's docstring; the final calls per id."""
    ids = committed(db)
    assert len(ids) == len(set(ids)) == len(guids)  # 0 applied twice …
    assert set(ids) == set(guids)  # … 0 lost
    st = state(url)
    assert settled(st, empty=empty), st  # nothing pending or unacked (or in the stream)
    assert st["last_seq"] == len(guids)  # one stored copy per id published
    calls = Counter(p.check_keys()["by_guid"])  # every call: Idempotency-Key = the id
    assert set(calls) == set(guids) and min(calls.values()) >= 1
    for k, (done, before) in enumerate(snapshots):
        late = {g: (before[g], calls[g]) for g in done if calls[g] != before[g]}
        assert not late, f"called again after its commit (fault {k}): {late}"
    repeated = {g: c for g, c in calls.items() if c > 1}
    assert sum(c - 1 for c in repeated.values()) <= holders * PREFETCH, repeated
    return calls


def test_consumers_killed_9_at_random_moments(own_nats: NatsServer, tmp_path: Path) -> None:  # noqa: F811
    seed = int(os.environ.get("ONCEQ_TEST_SEED", time.time_ns() % 1_000_000))
    print(f"seed {seed}")
    rng = random.Random(seed)
    n, kills = 300, 8
    guids = prepare(own_nats.url, tmp_path / "claims", n)
    db = tmp_path / "ledger.db"
    snapshots: list[tuple[set[str], Counter[str]]] = []
    # 50 ms a call: the run lasts some seconds, in which the kills fall.
    with partner(delay=0.05) as p:
        cs = Consumers(own_nats.url, p.url, db, tmp_path / "logs")
        try:
            cs.start_two(p)
            p.release()
            for _ in range(kills):
                # A random moment: mostly mid-run, at times before the first commit.
                time.sleep(rng.uniform(0.05, 0.8))
                if len(committed(db)) >= n:
                    break
                cs.kill(rng.choice(cs.live))
                snapshots.append(snapshot(db, p))
                cs.start()
            # The killed ones' copies come back after AckWait; the others finish them.
            wait_for(lambda: len(committed(db)) >= n, timeout=120, step=0.2)
            drained(own_nats.url, db, empty=True)
            summaries = cs.stop()
        except BaseException:
            cs.abort()
            print(cs.stderr())
            raise
        calls = check(guids, db, own_nats.url, p, snapshots, holders=cs.killed)
    print(f"kills: {cs.killed}; calls repeated: {sum(c - 1 for c in calls.values())}")
    assert cs.killed >= 1
    assert "Traceback" not in cs.stderr()
    assert all(s.get("unsettled", 0) == 0 for s in summaries), summaries


def test_the_server_killed_9_and_restarted_mid_run(own_nats: NatsServer, tmp_path: Path) -> None:  # noqa: F811
    seed = int(os.environ.get("ONCEQ_TEST_SEED", time.time_ns() % 1_000_000))
    print(f"seed {seed}")
    rng = random.Random(seed)
    n, outages = 300, 3
    guids = prepare(own_nats.url, tmp_path / "claims", n)
    db = tmp_path / "ledger.db"
    snapshots: list[tuple[set[str], Counter[str]]] = []
    with partner(delay=0.005) as p:
        cs = Consumers(own_nats.url, p.url, db, tmp_path / "logs")
        try:
            cs.start_two(p)
            # Both connected before the first outage: a consumer that cannot connect at
            # its start exits 7 by design (a wrong URL must not wait forever); the test
            # is about connections lost mid-run.
            live = {proc.pid for proc in cs.live}
            try:
                wait_for(lambda: live <= heartbeats(db, connected=True), timeout=120, step=0.1)
            except AssertionError:
                ended = {proc.pid: proc.poll() for proc in cs.live}
                raise AssertionError(
                    f"not both connected: {ended} {heartbeats(db)}\n{cs.stderr()}"
                ) from None
            p.release()
            for k in range(outages):
                # Mid-run: after some commits, before the last.
                target = (k + 1) * n // (outages + 2)
                wait_for(lambda t=target: len(committed(db)) >= t, timeout=90, step=0.05)
                own_nats.kill()  # kill -9: the consumers' connections drop mid-batch
                snapshots.append(snapshot(db, p))
                time.sleep(rng.uniform(0.3, 2.0))  # down for a moment …
                own_nats.start()  # … then back on the same port and store
            wait_for(lambda: len(committed(db)) >= n, timeout=120, step=0.2)
            drained(own_nats.url, db, empty=False)
            # They waited for the server, none gave up.
            ended = {proc.pid: proc.returncode for proc in cs.live if proc.poll() is not None}
            assert not ended, f"ended during the outages: {ended}\n{cs.stderr()}"
            summaries = cs.stop()
        except BaseException:
            cs.abort()
            print(cs.stderr())
            raise
        # An outage strands what every live consumer held: its acks may be lost with it.
        calls = check(guids, db, own_nats.url, p, snapshots, holders=outages * 2, empty=False)
    print(
        f"calls repeated: {sum(c - 1 for c in calls.values())}; left in the stream below"
        f" the ack floor: {state(own_nats.url).get('messages')}"
    )
    assert own_nats.starts == outages + 1
    assert "Traceback" not in cs.stderr()
    assert sum(s.get("processed", 0) for s in summaries) <= n
