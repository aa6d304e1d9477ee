"""A PostgreSQL ledger lost during a run (issue 9): the run goes on and loses nothing.

The ledger's database refuses connections (ALTER DATABASE … ALLOW_CONNECTIONS false)
and every session in it is terminated — the server itself keeps running, as in a
failover or a pooler restart — and 6 s later it allows them again. Two cases:

- mid-run: two `onceq mq consume` processes are working through 800 claims, their
  group commits under way. The commits wait in their thread (their copies unsettled,
  every slot taken), so no new copy is read: nothing is called while the ledger is
  away, the consumers stay up at next to no CPU, and when it is back the same groups
  are written once.
- arriving while away: an idle consumer gets 200 new claims while the ledger is away.
  Its duplicate check cannot run, so each copy is HELD (given back untried) and the
  consumer pauses (the broker sees no consumer on claim.in: no redelivery storm) until
  the ledger answers its ping, then takes them again.

Either way, at the end every claim is recorded exactly once and called exactly once,
nothing is left in any queue (so nothing was acked without its record: an acked,
unrecorded claim would be missing), and the logs said it in a few lines, without the
URL's password.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from mq_support import claim_doc, cli, consumers, partner, queues, wait_for, write_claims
from pg_support import ADMIN_URL

pytestmark = [pytest.mark.broker, pytest.mark.pg, pytest.mark.slow]

DOWN_S = 6.0
PREFETCH = 20
SECRET = "s3cret-ledger-pw"


def recorded(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            row = conn.execute("SELECT count(*) FROM onceq.messages").fetchone()
        except psycopg.errors.UndefinedTable:
            return 0
    return int(row[0]) if row else 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ledger_access(db: str, allow: bool) -> int:
    """Allow or refuse connections to `db`; when refusing, end the sessions it has."""
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS {"true" if allow else "false"}')
        if allow:
            return 0
        row = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s",
            (db,),
        ).fetchone()
        return int(row[0]) if row else 0


def publish(amqp_url: str, folder: Path, guids: list[str]) -> None:
    r = cli(amqp_url, "mq", "publish",
            *map(str, write_claims(folder, [claim_doc(g) for g in guids])))  # fmt: skip
    assert r.returncode == 0, r.stderr


class Run:
    """`count` consumer processes on the ledger at `url` (its password given)."""

    def __init__(self, amqp_url: str, claim: str, url: str, tmp: Path, count: int) -> None:
        self.tmp = tmp
        self.files = [(tmp / f"c{n}.out").open("w") for n in range(count)]
        self.errs = [(tmp / f"c{n}.err").open("w") for n in range(count)]
        self.procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "onceq",
                    "mq",
                    "consume",
                    "--claim",
                    claim,
                    "--db",
                    url,
                    "--prefetch",
                    str(PREFETCH),
                    "--json",
                ],
                stdout=out,
                stderr=err,
                text=True,
                env={**os.environ, "EAI_AMQP_URL": amqp_url},
            )
            for out, err in zip(self.files, self.errs, strict=True)
        ]

    def cpu(self) -> list[float]:
        return [cpu_seconds(p.pid) for p in self.procs]

    def stop(self) -> tuple[list[dict[str, Any]], list[str]]:
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=60) for p in self.procs]
        self.close()
        errs = [(self.tmp / f"c{n}.err").read_text() for n in range(len(self.procs))]
        assert codes == [0] * len(codes), errs
        outs = [json.loads((self.tmp / f"c{n}.out").read_text()) for n in range(len(codes))]
        return outs, errs

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in (*self.files, *self.errs):
            f.close()


@contextmanager
def ledger_away(pg_url: str) -> Iterator[float]:
    """The ledger's database away for the block; yields when it went."""
    db = pg_url.rsplit("/", 1)[1]
    terminated = ledger_access(db, allow=False)
    try:
        assert terminated > 0
        yield time.monotonic()
    finally:
        ledger_access(db, allow=True)


def outage(run: Run, p: Any, since: float, settle_s: float) -> tuple[list[float], float]:
    """Watch the rest of the outage: CPU per consumer and the wall time it covers; no
    partner call starts (the calls in flight when it began had `settle_s` to end)."""
    time.sleep(settle_s)
    calls0, cpu0, t0 = p.stats()["total"], run.cpu(), time.monotonic()
    time.sleep(max(0.5, DOWN_S - (t0 - since)))
    cpu = [b - a for a, b in zip(cpu0, run.cpu(), strict=True)]
    wall = time.monotonic() - t0
    assert [c.poll() for c in run.procs] == [None] * len(run.procs)  # the run goes on
    assert p.stats()["total"] == calls0  # nothing called while the ledger was away
    return cpu, wall


def check_end(pg_url: str, guids: list[str], calls: dict[str, int], amqp_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute("SELECT msg_id FROM onceq.messages ORDER BY 1")]
        failures = conn.execute("SELECT count(*) FROM onceq.failures").fetchone()
    assert ids == guids and failures == (0,)
    assert calls == dict.fromkeys(guids, 1)  # none called twice, none skipped
    assert all(v == (0, 0) for v in queues(amqp_url, exact=True).values()), queues(
        amqp_url, exact=True
    )


def test_a_ledger_lost_mid_run_holds_the_commits_and_loses_nothing(
    amqp_url: str, pg_url: str, tmp_path: Path
) -> None:
    n = 800
    url = pg_url.replace("postgres@", f"postgres:{SECRET}@")  # trust: any password works
    guids = [f"ll-{i:04d}" for i in range(n)]
    assert cli(amqp_url, "mq", "topology").returncode == 0
    publish(amqp_url, tmp_path / "c", guids)
    with partner(0.02) as p:
        run = Run(amqp_url, p.url, url, tmp_path, 2)
        try:
            wait_for(lambda: recorded(pg_url) >= n // 4, 60, step=0.01)
            with ledger_away(pg_url) as since:
                cpu, wall = outage(run, p, since, settle_s=1.0)
            back = time.monotonic()
            wait_for(lambda: recorded(pg_url) == n, 60)
            wait_for(lambda: all(v == (0, 0) for v in queues(amqp_url, exact=True).values()), 60)
            drained = time.monotonic() - back
            outs, errs = run.stop()
        finally:
            run.close()
        calls = p.stats()["by_guid"]
    print(
        f"\nledger away {DOWN_S:.0f}s mid-run: consumer CPU {cpu[0]:.2f}s and {cpu[1]:.2f}s"
        f" over {wall:.1f}s; drained {drained:.1f}s after its return"
    )
    check_end(pg_url, guids, calls, amqp_url)
    assert sum(o["processed"] for o in outs) == n
    assert all(c < 0.1 * wall for c in cpu), (cpu, wall)  # an outage costs no CPU
    for err in errs:
        assert SECRET not in err
        assert err.count("connection lost") >= 1 and "reconnected after" in err, err
        # psycopg's own note on the terminated session's pipeline is not passed on.
        for noise in ("AsyncPipeline", " at 0x", "Task exception was never retrieved"):
            assert noise not in err, err


def test_claims_arriving_while_the_ledger_is_away_are_held_and_the_consumer_pauses(
    amqp_url: str, pg_url: str, tmp_path: Path
) -> None:
    n = 200
    url = pg_url.replace("postgres@", f"postgres:{SECRET}@")
    guids = [f"la-{i:04d}" for i in range(n)]
    assert cli(amqp_url, "mq", "topology").returncode == 0
    with partner(0.0) as p:
        run = Run(amqp_url, p.url, url, tmp_path, 1)
        try:
            wait_for(lambda: consumers(amqp_url) == 1, 30)
            with ledger_away(pg_url) as since:
                publish(amqp_url, tmp_path / "c", guids)
                # Held and given back untried; paused: no consumer, everything ready.
                wait_for(lambda: consumers(amqp_url) == 0, DOWN_S - 1)
                wait_for(lambda: queues(amqp_url, exact=True)["claim.in"] == (n, 0), DOWN_S - 1)
                cpu, wall = outage(run, p, since, settle_s=0.0)
                assert queues(amqp_url, exact=True)["claim.in"] == (n, 0)  # no redelivery storm
            back = time.monotonic()
            wait_for(lambda: recorded(pg_url) == n, 60)
            wait_for(lambda: all(v == (0, 0) for v in queues(amqp_url, exact=True).values()), 60)
            drained = time.monotonic() - back
            outs, errs = run.stop()
        finally:
            run.close()
        calls = p.stats()["by_guid"]
    print(
        f"\nclaims arriving while the ledger is away: held {outs[0]['held']}, consumer CPU"
        f" {cpu[0]:.2f}s over {wall:.1f}s paused; drained {drained:.1f}s after its return"
    )
    check_end(pg_url, guids, calls, amqp_url)
    assert outs[0]["processed"] == n and 1 <= outs[0]["held"] <= PREFETCH + 1
    assert cpu[0] < 0.1 * wall, (cpu, wall)
    (err,) = errs
    assert SECRET not in err
    assert err.count("holding messages until it answers") == 1, err
    for noise in ("AsyncPipeline", " at 0x", "Task exception was never retrieved"):
        assert noise not in err, err
    assert err.count("answers again after") == 1, err
