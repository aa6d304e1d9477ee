"""One suite, every effect kind over every source: what a flow's effect promises end to end.

Each effect — HTTP (a real partner process, `onceq partner invoices`), Python (a
user's function), SQL in the ledger's transaction — runs through the real engine
(`onceq.run`, the flow's source opened by its own type) over each source: a
directory queue, a RabbitMQ queue (a vhost of its own) and a NATS JetStream stream
(names of its own on the shared server). The same messages and the same assertions
for all nine:

    INV-1..4   done: one effect each, committed, then acked / moved to done/
    INV-1      re-sent: a duplicate, no second effect
    INV-5      rejected (total missing): dead at once, one attempt
    INV-6      transient (customer BUSY-…), always: tried at once, once more at once,
               once after the policy's delay, dead on that last attempt

Exact: the ledger's rows (messages, duplicates, failures with their actions), the
effect's calls per id (the partner's count, the function's; an SQL function's within
the bounds of its group's rerun) and what it applied (the partner's acceptances, the
function's returns, the SQL rows committed),
the run's counts, and the source left with nothing waiting and the two dead letters.
Small counts, one process: the point is the contract, not the load.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import nats_support
from mq_support import partner
from nats_support import nats_names_fixture  # noqa: F401  (the fixture nats_names)
from onceq import (
    BreakerPolicy,
    Flow,
    HttpEffect,
    MessageSpec,
    PythonEffect,
    Reject,
    Retry,
    RetryPolicy,
    SqlEffect,
    run,
)
from onceq._sources.amqp.plugin import RabbitSource
from onceq._sources.dirq.files import write_atomic
from onceq._sources.dirq.plugin import DirSource
from onceq._sources.dirq.queue import DirQueue
from onceq._sources.nats.plugin import NatsSource

DONE = ["INV-1", "INV-2", "INV-3", "INV-4"]
REJECTED, BUSY = "INV-5", "INV-6"
DOCS: list[dict[str, Any]] = [
    *({"invoiceId": i, "customer": "ACME", "total": 10 * n} for n, i in enumerate(DONE, 1)),
    {"invoiceId": REJECTED, "customer": "ACME"},  # no total: the partner's 422
    {"invoiceId": BUSY, "customer": "BUSY-co", "total": 5},  # the partner's 503, always
    {"invoiceId": "INV-1", "customer": "ACME", "total": 10},  # re-sent, last
]
# One immediate retry, then one after a short delay: three attempts, then dead.
POLICY = RetryPolicy(immediate=1, delays=(0.5,))
ATTEMPTS = 3
SPEC = MessageSpec(id_field="invoiceId")


# --- the sources -----------------------------------------------------------------------


class Dirq:
    kind = "dirq"

    def __init__(self, tmp_path: Path) -> None:
        self.q = DirQueue(tmp_path / "q")

    def fill(self) -> DirSource:
        self.q.init()
        for i, doc in enumerate(DOCS):
            write_atomic(self.q.folder("inbox"), f"m{i:03d}.json", json.dumps(doc).encode())
        return DirSource(self.q.root)

    def left(self) -> dict[str, Any]:
        def names(f: str) -> int:
            return sum(1 for p in self.q.folder(f).rglob("*") if p.is_file())

        return {f: names(f) for f in ("inbox", "processing", "retry")}

    def dead_ids(self) -> list[str]:
        return sorted(
            json.loads(p.read_bytes())["invoiceId"] for p in self.q.folder("error").iterdir()
        )

    def finished(self) -> int:
        """Copies settled as done (a duplicate included)."""
        return sum(1 for _ in self.q.folder("done").iterdir())


class Rabbit:
    kind = "rabbitmq"

    def __init__(self, url: str) -> None:
        self.url = url
        self.source = RabbitSource(queue="invoice.in", url=url)

    def fill(self) -> RabbitSource:
        import pika

        from onceq._sources.amqp.topology import Topology
        from onceq._sources.amqp.topology_declare import declare

        self.topology = Topology.for_source(self.source, POLICY.delays)
        asyncio.run(declare(self.url, self.topology))
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            for doc in DOCS:
                ch.basic_publish("", "invoice.in", json.dumps(doc).encode(),
                                 pika.BasicProperties(delivery_mode=2))  # fmt: skip
        finally:
            conn.close()
        return self.source

    def left(self) -> dict[str, Any]:
        from mq_support import queues

        q = queues(self.url, exact=True)
        tiers = {k: v for k, v in q.items() if k not in ("invoice.in", "invoice.dead")}
        assert len(tiers) == len(POLICY.delays), q  # the policy's tier, and no other queue
        return {"ready": q["invoice.in"][0], "unacked": q["invoice.in"][1],
                "tiers": sum(r + u for r, u in tiers.values())}  # fmt: skip

    def dead_ids(self) -> list[str]:
        from mq_support import get_all

        return sorted(json.loads(b)["invoiceId"] for _, _, b in get_all(self.url, "invoice.dead"))

    def finished(self) -> None:
        return None  # an ack leaves nothing to count


class Nats:
    kind = "nats"

    def __init__(self, names: nats_support.Names) -> None:
        self.names = names

    def fill(self) -> NatsSource:
        nats_support.setup(self.names, ack_wait=5.0)
        # No Nats-Msg-Id: the re-sent INV-1 must be stored (the server's duplicate
        # window would drop it); the id is then the body's invoiceId.
        nats_support.publish(self.names, [(json.dumps(d).encode(), {}) for d in DOCS])
        n = self.names
        return NatsSource(stream=n.stream, durable=n.durable, subject=n.subject, url=n.url)

    def left(self) -> dict[str, Any]:
        s = nats_support.consumer_state(self.names)
        return {"ready": s["pending"], "unacked": s["ack_pending"], "stored": s["stored"]}

    def dead_ids(self) -> list[str]:
        return sorted(json.loads(b)["invoiceId"] for b, _ in nats_support.dead_letters(self.names))

    def finished(self) -> None:
        return None


SOURCES = ["dirq", "amqp", "nats"]


@pytest.fixture(name="source", params=SOURCES)
def source_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "dirq":
        return Dirq(tmp_path)
    if request.param == "amqp":
        return Rabbit(request.getfixturevalue("amqp_url"))
    return Nats(request.getfixturevalue("nats_names"))


def nothing_left(source: Any) -> dict[str, int]:
    return dict.fromkeys(source.left(), 0)


# --- the effects -----------------------------------------------------------------------


class Calls:
    """A user function's calls per id (thread-safe: a sync function runs in a thread)."""

    def __init__(self) -> None:
        self.by_id: Counter[str] = Counter()
        self._lock = threading.Lock()

    def count(self, doc: dict[str, Any]) -> None:
        with self._lock:
            self.by_id[doc["invoiceId"]] += 1


def verdict(doc: dict[str, Any], busy: type[Exception]) -> None:
    """The invoice partner's rules, as a function raises them."""
    if "total" not in doc:
        raise Reject("total missing")
    if str(doc.get("customer", "")).startswith("BUSY"):
        raise busy("invoice partner busy")


class Effect:
    kind = ""
    reruns = False  # whether one attempt may run the function twice (see the test)
    reject_reason = ""
    busy_reason = ""

    def flow(self) -> dict[str, Any]:
        raise NotImplementedError

    def calls(self) -> Counter[str]:
        raise NotImplementedError

    def applied(self, db: Path) -> Counter[str]:
        """Each id's effect as it stands (a partner's acceptances, the rows written)."""
        raise NotImplementedError


class Http(Effect):
    kind = "http"
    reject_reason, busy_reason = "http-422", "http-503"

    def __init__(self, url: str, stats: Any) -> None:
        self.url, self._stats = url, stats

    def flow(self) -> dict[str, Any]:
        return {"effect": HttpEffect(f"{self.url}/api/invoices", timeout=5.0)}

    def calls(self) -> Counter[str]:
        return Counter(self._stats()["by_id"])

    def applied(self, db: Path) -> Counter[str]:
        # The partner answers 201 once per invoice and 409 to any later call for it:
        # its statuses say how many acceptances there were, and that none came twice.
        statuses = {int(k): v for k, v in self._stats()["by_status"].items()}
        assert statuses == {201: len(DONE), 422: 1, 503: ATTEMPTS}, statuses
        return Counter({i: c for i, c in self.calls().items() if i in DONE})


class Python(Effect):
    kind = "python"
    reject_reason, busy_reason = "rejected", "retry"

    def __init__(self) -> None:
        self.seen = Calls()
        self.done: Counter[str] = Counter()

    def flow(self) -> dict[str, Any]:
        def handle(doc: dict[str, Any]) -> None:
            self.seen.count(doc)
            verdict(doc, Retry)
            self.done[doc["invoiceId"]] += 1

        return {"effect": PythonEffect(handle)}

    def calls(self) -> Counter[str]:
        return self.seen.by_id

    def applied(self, db: Path) -> Counter[str]:
        return self.done


class Sql(Effect):
    kind = "sql"
    reject_reason, busy_reason = "sql-rejected", "sql-error"
    reruns = True

    def __init__(self) -> None:
        self.seen = Calls()

    def flow(self) -> dict[str, Any]:
        def write(tx: Any, doc: dict[str, Any]) -> None:
            self.seen.count(doc)
            verdict(doc, RuntimeError)  # any other exception: transient (sql-error)
            tx.execute(
                "INSERT INTO invoices (id, total) VALUES (?, ?)", (doc["invoiceId"], doc["total"])
            )

        setup = "CREATE TABLE IF NOT EXISTS invoices (id TEXT PRIMARY KEY, total INTEGER)"
        return {"sql": SqlEffect(write, setup=setup)}

    def calls(self) -> Counter[str]:
        return self.seen.by_id

    def applied(self, db: Path) -> Counter[str]:
        return Counter(i for (i,) in rows(db, "SELECT id FROM invoices"))


@pytest.fixture(name="effect", params=["http", "python", "sql"])
def effect_fixture(request: pytest.FixtureRequest) -> Iterator[Effect]:
    if request.param == "http":
        with partner(kind="invoices") as p:
            yield Http(p.url, p.stats)
    elif request.param == "python":
        yield Python()
    else:
        yield Sql()


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute(sql).fetchall()


# --- the contract ----------------------------------------------------------------------


def test_each_effect_over_each_source_keeps_the_same_promises(
    source: Any, effect: Effect, tmp_path: Path
) -> None:
    db = tmp_path / "ledger.db"
    flow = Flow(
        name="invoices",
        source=source.fill(),
        message=SPEC,
        retry=POLICY,
        breaker=BreakerPolicy(enabled=False),  # INV-6's failures must not pause the rest
        **effect.flow(),
    )
    stats = run(flow, ledger=db, until_empty=True, max_seconds=60)["invoices"]

    # The run's counts.
    assert (stats.processed, stats.duplicates, stats.dead, stats.recovered) == (4, 1, 2, 0), stats
    assert stats.reasons == {effect.reject_reason: 1, effect.busy_reason: 1}, stats
    assert stats.requeued == ATTEMPTS - 1, stats

    # The ledger: one row per id that took effect, the re-sent copy a duplicate, the
    # rejected one dead at its first attempt, the busy one dead at its last.
    assert sorted(i for (i,) in rows(db, "SELECT msg_id FROM messages")) == DONE
    assert rows(db, "SELECT msg_id FROM duplicates") == [("INV-1",)]
    failures = rows(db, "SELECT msg_id, reason, attempt, action FROM failures ORDER BY id")
    assert [f for f in failures if f[0] == REJECTED] == [
        (REJECTED, effect.reject_reason, 1, "dead")
    ]
    assert [f for f in failures if f[0] == BUSY] == [
        (BUSY, effect.busy_reason, 1, "requeue"),
        (BUSY, effect.busy_reason, 2, "delay"),
        (BUSY, effect.busy_reason, 3, "dead"),
    ]
    assert {f[0] for f in failures} == {REJECTED, BUSY}

    # The effect: called once per id that took effect (the duplicate never), once for
    # the rejected one, once per attempt for the busy one; applied exactly once each.
    expected = {**dict.fromkeys(DONE, 1), REJECTED: 1, BUSY: ATTEMPTS}
    calls = effect.calls()
    if effect.reruns:
        # An SQL function runs inside the group's transaction: when one of the group
        # raises, the group's savepoint is undone and each runs again under its own
        # (onceq._ledger.sql_step), so a function may run twice for one attempt; only
        # what it wrote is the effect, and that is exact below.
        assert set(calls) == set(expected), calls
        assert all(expected[i] <= c <= 2 * expected[i] for i, c in calls.items()), calls
    else:
        assert calls == expected
    assert effect.applied(db) == dict.fromkeys(DONE, 1)

    # The source: nothing waiting, nothing held, the two dead letters where they go.
    assert source.left() == nothing_left(source)
    assert source.dead_ids() == [REJECTED, BUSY]
    if source.finished() is not None:
        assert source.finished() == len(DONE) + 1  # done/: the four and the duplicate
