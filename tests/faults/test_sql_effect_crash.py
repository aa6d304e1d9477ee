"""kill -9 of a SQL-effect flow's consumer: the business rows equal the distinct ids.

The inbox pattern's promise (issue 7): the business rows a flow writes in the
ledger's transaction and the dedup row commit together or not at all, so a
database effect happens exactly once across any crash, with no idempotent partner.

A real consumer process (a script built from the library: `Consumer(Worker(DirQueue)),
Ledger(flow="inv", sql=SqlEffect(save)), decode, no_effect)`) runs over a directory
queue of invoices with re-sent copies, files that do not parse, and invoices the
function rejects. It is SIGKILLed at least 20 times at random moments (0–300 ms
into its work) and at the ONCEQ_FAULT points, restarted after each kill, then run
to the end. The `invoices` table has no unique key on purpose: an effect applied
twice would show as a second row, not hide behind a constraint.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import open_db, run_cli

pytestmark = pytest.mark.slow

SCRIPT = """
import asyncio, sys
from onceq._core.consumer import Consumer, Outcome, no_effect
from onceq._sources.dirq.queue import DirQueue
from onceq._sources.dirq.worker import Worker
from onceq._core.effect import Reject, SqlEffect
from onceq._ledger.sqlite import Ledger
from onceq._core.transport import Kind
import json

SETUP = "CREATE TABLE IF NOT EXISTS invoices (id TEXT, customer TEXT, total REAL)"

def decode(d):
    try:
        doc = json.loads(d.body)
    except ValueError:
        return Outcome(Kind.REJECTED, "parse")
    d.msg_id = doc["invoiceId"]
    fields = {"group": doc["customer"], "seq": None, "kept": {"total": doc["total"]}, "doc": doc}
    return Outcome(Kind.SUCCESS, fields=fields)

def save(tx, doc):
    row = (doc["invoiceId"], doc["customer"], doc["total"])
    tx.execute("INSERT INTO invoices VALUES (?,?,?)", row)
    if doc["total"] < 0:
        raise Reject("negative total")

async def main(q, db):
    effect = SqlEffect(save, setup=SETUP)
    with Ledger(db, flow="inv", sql=effect) as ledger, Worker(DirQueue(q)) as w:
        print("ready", flush=True)
        c = Consumer(w, ledger, decode, no_effect, max_in_flight=16, max_group=8, max_attempts=1)
        await c.run()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""

POINTS = ("before-commit", "after-commit-before-settle", "mid-settle", "after-claim")


class Invoices:
    """Writes invoice files into a queue's inbox and knows what they must come to."""

    def __init__(self, root: Path, rng: random.Random) -> None:
        assert run_cli("dirq", "init", str(root)).returncode == 0
        self.root, self.rng, self.n = root, rng, 0
        self.good: set[str] = set()  # ids that must take effect, once each
        self.bad_files: set[str] = set()  # files that must end in error/
        self.good_files: set[str] = set()  # files that must end in done/
        self.ids: list[tuple[str, float]] = []

    def add(self, count: int) -> None:
        """`count` more files: 2% not JSON, ~13% re-sent copies of recent invoices
        (maybe already consumed by an earlier run), 3% invoices the function rejects."""
        rng = self.rng
        for _ in range(count):
            i, self.n = self.n, self.n + 1
            name = f"inv-{i:06d}.json"
            roll = rng.random()
            if roll < 0.02:
                body = b'{"invoiceId": '
                self.bad_files.add(name)
            else:
                if self.ids and roll < 0.15:
                    inv, total = rng.choice(self.ids[-20:])
                else:
                    total = -1.0 if roll > 0.97 else round(rng.random() * 100, 2)
                    inv = f"INV-{i}"
                    self.ids.append((inv, total))
                doc = {"invoiceId": inv, "customer": f"C{i % 7}", "total": total}
                body = json.dumps(doc).encode()
                (self.bad_files if total < 0 else self.good_files).add(name)
                if total >= 0:
                    self.good.add(inv)
            (self.root / "inbox" / name).write_bytes(body)


def start(script: Path, root: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(script), str(root), str(root / "ledger.db")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


TOP_UP = 8000


def test_sql_effect_is_exactly_once_across_kill_9(tmp_path: Path) -> None:
    rng = random.Random(11)
    root = tmp_path / "q"
    inv = Invoices(root, rng)
    script = tmp_path / "consumer.py"
    script.write_text(SCRIPT)
    kills = 0
    for round_ in range(24):
        # Topped up before each run, so every kill lands in the middle of work however
        # fast the machine drains the queue (1,500 files were once enough; a run now
        # drains them within the 0.3 s a kill may wait).
        if len(os.listdir(root / "inbox")) < TOP_UP:
            inv.add(TOP_UP)
        if round_ % 3 == 0:  # a fault point: the process kills itself at an exact window
            env = {"ONCEQ_FAULT": rng.choice(POINTS), "ONCEQ_FAULT_AFTER": str(rng.randint(1, 9))}
            p = start(script, root, env)
        else:
            p = start(script, root)
            assert p.stdout is not None and p.stdout.readline() == "ready\n", p.stderr
            time.sleep(rng.random() * 0.3)
            p.send_signal(signal.SIGKILL)
        _, err = p.communicate(timeout=60)
        assert p.returncode == -signal.SIGKILL, (round_, p.returncode, err)
        kills += 1
    assert kills >= 20
    p = start(script, root)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err

    assert os.listdir(root / "inbox") == []
    assert [d for d in (root / "processing").iterdir() if os.listdir(d)] == []
    assert set(os.listdir(root / "done")) == inv.good_files
    assert set(os.listdir(root / "error")) == inv.bad_files
    with open_db(root / "ledger.db") as conn:
        business = [r[0] for r in conn.execute("SELECT id FROM invoices")]
        dedup = {r[0] for r in conn.execute("SELECT msg_id FROM messages WHERE flow = 'inv'")}
    assert sorted(business) == sorted(inv.good)  # each id once: no more, no fewer
    assert dedup == inv.good
