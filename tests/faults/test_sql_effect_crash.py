"""kill -9 of a SQL-effect flow's consumer: the business rows equal the distinct ids.

The inbox pattern's promise (issue 7): the business rows a flow writes in the
ledger's transaction and the dedup row commit together or not at all, so a
database effect happens exactly once across any crash, with no idempotent partner.

One body over each source (dirq, RabbitMQ, NATS JetStream). A real consumer process
(a script built from the library: on a directory queue `Consumer(Worker(DirQueue)),
Ledger(flow="inv", sql=SqlEffect(save)), decode, no_effect)`; on a broker the flow
API, `onceq.run(Flow(source=…, sql=SqlEffect(save)))`) runs over invoices with
re-sent copies, bodies that do not parse, and invoices the function rejects. It is
SIGKILLed at random moments into its work and at the ONCEQ_FAULT points (the engine's
and the source's own), restarted after each kill, then run to the end (dirq: at
least 20 kills; a broker: at least 10). The `invoices` table has no unique key on
purpose: an effect applied twice would show as a second row, not hide behind a
constraint. Every copy ends in exactly one place: done (acked), or dead (error/, the
dead-letter queue or stream) for each that does not parse or is rejected.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import nats_support
from mq_support import get_all, queues, wait_for
from nats_support import nats_names_fixture  # noqa: F401  (the fixture nats_names)
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


class Invoices:
    """Makes invoice messages (name, body) and knows what they must come to."""

    def __init__(self, rng: random.Random) -> None:
        self.rng, self.n = rng, 0
        self.good: set[str] = set()  # ids that must take effect, once each
        self.bad_files: set[str] = set()  # files that must end in error/
        self.good_files: set[str] = set()  # files that must end in done/
        self.bad_bodies: Counter[bytes] = Counter()  # copies that must end dead
        self.ids: list[tuple[str, float]] = []

    def add(self, count: int) -> list[tuple[str, bytes]]:
        """`count` more messages: 2% not JSON, ~13% re-sent copies of recent invoices
        (maybe already consumed by an earlier run), 3% invoices the function rejects."""
        rng = self.rng
        out = []
        for _ in range(count):
            i, self.n = self.n, self.n + 1
            name = f"inv-{i:06d}.json"
            roll = rng.random()
            if roll < 0.02:
                body = b'{"invoiceId": ' + str(i).encode()
                self.bad_files.add(name)
                self.bad_bodies[body] += 1
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
                else:
                    self.bad_bodies[body] += 1
            out.append((name, body))
        return out


FLOW_SCRIPT = """
import json, sys
from onceq import BreakerPolicy, Flow, MessageSpec, Reject, RetryPolicy, SqlEffect, run
from onceq._sources.amqp.plugin import RabbitSource
from onceq._sources.nats.plugin import NatsSource

SETUP = "CREATE TABLE IF NOT EXISTS invoices (id TEXT, customer TEXT, total REAL)"

def save(tx, doc):
    row = (doc["invoiceId"], doc["customer"], doc["total"])
    tx.execute("INSERT INTO invoices VALUES (?,?,?)", row)
    if doc["total"] < 0:
        raise Reject("negative total")

kind, args, db, until_empty = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
source = RabbitSource(**args) if kind == "amqp" else NatsSource(**args)
flow = Flow(name="inv", source=source, message=MessageSpec(id_field="invoiceId"),
            sql=SqlEffect(save, setup=SETUP), retry=RetryPolicy(immediate=0, delays=()),
            breaker=BreakerPolicy(enabled=False))
print("ready", flush=True)
run(flow, ledger=db, until_empty=until_empty == "1")
"""


class Dirq:
    """The directory queue: files in inbox/, the queue's own consumer script."""

    kind = "dirq"
    rounds, top_up, kill_within, min_kills = 24, 8000, 0.3, 20
    points = ("before-commit", "after-commit-before-settle", "mid-settle", "after-claim")

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "q"
        assert run_cli("dirq", "init", str(self.root)).returncode == 0
        self.db = self.root / "ledger.db"
        self.script = tmp_path / "consumer.py"
        self.script.write_text(SCRIPT)

    def waiting(self) -> int:
        return len(os.listdir(self.root / "inbox"))

    def put(self, items: list[tuple[str, bytes]]) -> None:
        for name, body in items:
            (self.root / "inbox" / name).write_bytes(body)

    def argv(self, final: bool) -> list[str]:
        # The queue's consumer ends by itself when its inbox is empty.
        return [str(self.script), str(self.root), str(self.db)]

    def check_left(self, inv: Invoices) -> None:
        root = self.root
        assert os.listdir(root / "inbox") == []
        assert [d for d in (root / "processing").iterdir() if os.listdir(d)] == []
        assert set(os.listdir(root / "done")) == inv.good_files
        assert set(os.listdir(root / "error")) == inv.bad_files


class Broker:
    """A broker queue or stream, consumed by `onceq.run` over the flow's source."""

    kind = ""
    # Fewer, smaller rounds than the directory queue's: a publish costs more than a
    # file, and each kill strands what the broker returns only later (NATS: AckWait).
    rounds, top_up, kill_within, min_kills = 12, 1500, 0.5, 10
    points: tuple[str, ...] = ()

    def __init__(self, tmp_path: Path) -> None:
        self.db = tmp_path / "ledger.db"
        self.script = tmp_path / "consumer.py"
        self.script.write_text(FLOW_SCRIPT)

    def source_args(self) -> dict[str, object]:
        raise NotImplementedError

    def argv(self, final: bool) -> list[str]:
        # Until stopped in the killed rounds (a drained queue must not end the process
        # before its kill); --until-empty in the last.
        args = json.dumps(self.source_args())
        return [str(self.script), self.kind, args, str(self.db), "1" if final else "0"]

    def dead_bodies(self) -> Counter[bytes]:
        raise NotImplementedError

    def state(self) -> dict[str, int]:
        raise NotImplementedError

    def check_left(self, inv: Invoices) -> None:
        assert self.state() == dict.fromkeys(self.state(), 0)  # nothing waiting or held
        assert self.dead_bodies() == inv.bad_bodies  # each bad copy dead, once


class Rabbit(Broker):
    kind = "amqp"
    points = ("before-commit", "after-commit-before-settle", "mid-settle")
    QUEUE = "invoice.in"

    def __init__(self, tmp_path: Path, url: str) -> None:
        super().__init__(tmp_path)
        import asyncio

        from onceq._sources.amqp.plugin import RabbitSource
        from onceq._sources.amqp.topology import Topology
        from onceq._sources.amqp.topology_declare import declare

        self.url = url
        asyncio.run(declare(url, Topology.for_source(RabbitSource(queue=self.QUEUE))))

    def source_args(self) -> dict[str, object]:
        return {"queue": self.QUEUE, "url": self.url}

    def waiting(self) -> int:
        return queues(self.url, exact=True)[self.QUEUE][0]

    def put(self, items: list[tuple[str, bytes]]) -> None:
        import pika

        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            ch = conn.channel()
            before = ch.queue_declare(self.QUEUE, passive=True).method.message_count
            for _, body in items:
                ch.basic_publish("", self.QUEUE, body, pika.BasicProperties(delivery_mode=2))
            # Instead of a confirm per message (a round trip each): no consumer runs
            # now, so the queue's depth grows by exactly the batch once all arrived.
            wait_for(
                lambda: (
                    ch.queue_declare(self.QUEUE, passive=True).method.message_count
                    >= before + len(items)
                ),
                timeout=30,
            )
        finally:
            conn.close()

    def state(self) -> dict[str, int]:
        q = queues(self.url, exact=True)
        assert set(q) == {self.QUEUE, "invoice.dead"}, q
        return {"ready": q[self.QUEUE][0], "unacked": q[self.QUEUE][1]}

    def dead_bodies(self) -> Counter[bytes]:
        return Counter(body for _, _, body in get_all(self.url, "invoice.dead"))


class Nats(Broker):
    kind = "nats"
    points = ("before-commit", "after-commit-before-settle", "mid-settle", "after-dead-publish")

    def __init__(self, tmp_path: Path, names: nats_support.Names) -> None:
        super().__init__(tmp_path)
        self.names = names
        nats_support.setup(names, ack_wait=2.0)

    def source_args(self) -> dict[str, object]:
        n = self.names
        return {"stream": n.stream, "durable": n.durable, "subject": n.subject, "url": n.url}

    def waiting(self) -> int:
        return nats_support.consumer_state(self.names)["pending"]

    def put(self, items: list[tuple[str, bytes]]) -> None:
        # No Nats-Msg-Id: a re-sent copy must be stored (the server's duplicate window
        # would drop it); the id is the body's invoiceId.
        nats_support.publish(self.names, [(body, {}) for _, body in items])

    def state(self) -> dict[str, int]:
        s = nats_support.consumer_state(self.names)
        return {"ready": s["pending"], "unacked": s["ack_pending"], "stored": s["stored"]}

    def dead_bodies(self) -> Counter[bytes]:
        return Counter(body for body, _ in nats_support.dead_letters(self.names))


@pytest.fixture(name="source", params=["dirq", "amqp", "nats"])
def source_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> Dirq | Broker:
    if request.param == "dirq":
        return Dirq(tmp_path)
    if request.param == "amqp":
        return Rabbit(tmp_path, request.getfixturevalue("amqp_url"))
    return Nats(tmp_path, request.getfixturevalue("nats_names"))


def start(source: Dirq | Broker, *, final: bool = False,
          env: dict[str, str] | None = None) -> subprocess.Popen[str]:  # fmt: skip
    return subprocess.Popen(
        [sys.executable, *source.argv(final)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def test_sql_effect_is_exactly_once_across_kill_9(source: Dirq | Broker) -> None:
    rng = random.Random(11)
    inv = Invoices(rng)
    kills = 0
    for round_ in range(source.rounds):
        # Topped up before each run, so every kill lands in the middle of work however
        # fast the machine drains the queue (1,500 files were once enough for a
        # directory queue; a run now drains them within the 0.3 s a kill may wait).
        if source.waiting() < source.top_up:
            source.put(inv.add(source.top_up))
        if round_ % 3 == 0:  # a fault point: the process kills itself at an exact window
            point = source.points[(round_ // 3) % len(source.points)]
            env = {"ONCEQ_FAULT": point, "ONCEQ_FAULT_AFTER": str(rng.randint(1, 9))}
            p = start(source, env=env)
        else:
            p = start(source)
            assert p.stdout is not None and p.stdout.readline() == "ready\n", p.stderr
            time.sleep(rng.random() * source.kill_within)
            p.send_signal(signal.SIGKILL)
        _, err = p.communicate(timeout=60)
        assert p.returncode == -signal.SIGKILL, (round_, p.returncode, err)
        kills += 1
    assert kills >= source.min_kills
    p = start(source, final=True)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err

    source.check_left(inv)
    with open_db(source.db) as conn:
        business = [r[0] for r in conn.execute("SELECT id FROM invoices")]
        dedup = {r[0] for r in conn.execute("SELECT msg_id FROM messages WHERE flow = 'inv'")}
    assert sorted(business) == sorted(inv.good)  # each id once: no more, no fewer
    assert dedup == inv.good
