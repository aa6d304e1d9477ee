"""One adapter per broker source, so a fault or effect test is one body run over each.

A test asks for `broker` (import `broker_fixture`), parametrised over "amqp" and
"nats": a fresh vhost (RabbitMQ, the `amqp_url` fixture) or fresh stream, subject and
durable names on the shared JetStream server (`nats_names`). What differs between
the two is here and only here: making the queue/stream, publishing claims, the
consume command line, the queue's state and its dead letters. The claim stub
(mq_support.partner) is the partner of both.

    broker.prepare(docs, resent=[...])    the queue/stream, then docs then resent
    broker.consume(db, claim, *args, **env)   `… consume --until-empty --json` run
    broker.returned()                     after a kill: nothing unacked any more
    broker.state()                        {"ready", "unacked", "dead"} of the queue
    broker.dead_ids()                     the ids of the dead letters, sorted

A re-sent copy must reach the consumer as a second delivery of the same id: on
RabbitMQ every publish does; on JetStream the server drops a second Nats-Msg-Id
inside its duplicate window, so a re-sent copy is published without one (the id is
then the body's `guid`): exactly a publisher's retry outside the window.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import nats_support
from mq_support import (
    EXERCISE,
    claim_doc,
    cli,
    publish,
    queues,
    rows,
    start_consumer,
    topology,
    wait_for,
    write_claims,
)
from support import run_cli

KINDS = ["amqp", "nats"]
# AckWait of a NATS test consumer: a killed consumer's copies come back after it.
NATS_ACK_WAIT = 2.0


class Broker:
    kind = ""
    # The fault point of the source's own "copies stored, originals not yet acked"
    # window, and which outcome makes that copy (a retry tier copy / a dead letter).
    copy_point = ""

    def prepare(
        self, docs: Sequence[dict[str, Any]], resent: Sequence[dict[str, Any]] = ()
    ) -> None:
        raise NotImplementedError

    def consume(
        self, db: Path, claim: str, *args: str, **env: str
    ) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError

    def start(self, db: Path, claim: str, *args: str) -> subprocess.Popen[str]:
        """`… consume --json` as a process of its own (no --until-empty: until stopped)."""
        raise NotImplementedError

    def returned(self, held: int = 1) -> None:
        """After a kill -9 of a consumer holding at most `held` copies: wait until the
        broker holds nothing for the dead process (or the next run will see to it)."""
        raise NotImplementedError

    def state(self) -> dict[str, int]:
        raise NotImplementedError

    def dead_ids(self) -> list[str]:
        raise NotImplementedError

    # -- the source's own copy window (copy_point) ------------------------------------
    # A claim that makes the copy (`copy_doc`), the queue/stream made for it and the
    # policy it is consumed with (`prepare_copies`, `COPY_POLICY`); `inventory()` counts
    # every id over the queue/stream, the copies and the ledger's messages; whether a
    # copy in flight at the kill may end dead twice (`dead_twice`).
    COPY_POLICY: tuple[str, ...] = ()
    dead_twice = False

    def copy_doc(self, guid: str) -> dict[str, Any]:
        raise NotImplementedError

    def prepare_copies(self, docs: Sequence[dict[str, Any]]) -> None:
        raise NotImplementedError

    def consume_copies(self, db: Path, claim: str, **env: str) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError

    def inventory(self, db: Path) -> Counter[str]:
        raise NotImplementedError

    def copies_left(self) -> int:
        raise NotImplementedError


class Rabbit(Broker):
    kind = "amqp"
    copy_point = "after-delay-publish"

    def __init__(self, url: str, folder: Path) -> None:
        self.url, self.folder = url, folder

    def prepare(
        self, docs: Sequence[dict[str, Any]], resent: Sequence[dict[str, Any]] = ()
    ) -> None:
        topology(self.url)
        publish(self.url, *write_claims(self.folder, [*docs, *resent]))

    def consume(
        self, db: Path, claim: str, *args: str, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return cli(self.url, "mq", "consume", "--claim", claim, "--db", str(db), "--json",
                   "--until-empty", *EXERCISE, *args, **env)  # fmt: skip

    def start(self, db: Path, claim: str, *args: str) -> subprocess.Popen[str]:
        return start_consumer(self.url, claim, db, *args)

    def returned(self, held: int = 1) -> None:
        # The broker saw the connection die: whatever was unacked is back in claim.in.
        wait_for(lambda: queues(self.url, exact=True)["claim.in"][1] == 0, timeout=30, step=0.3)

    def state(self) -> dict[str, int]:
        q = queues(self.url, exact=True)
        assert set(q) - {self.TIER} == {"claim.in", "claim.dead"}, q  # no other queue
        return {"ready": q["claim.in"][0], "unacked": q["claim.in"][1], "dead": q["claim.dead"][0]}

    def dead_ids(self) -> list[str]:
        from mq_support import get_all

        return sorted(json.loads(body)["guid"] for _, _, body in get_all(self.url, "claim.dead"))

    # The window: a DELAY settle's tier copy confirmed, the original not yet acked. A
    # claim the stub answers 503 (BUSY) is retried through a 2 s tier, then dead; the
    # original and its copy may each reach their last attempt: dead twice at worst.
    TIER = "claim.retry.2s"
    COPY_POLICY = ("--retry-delays", "2s", "--immediate-retries", "0", "--no-breaker")
    dead_twice = True

    def copy_doc(self, guid: str) -> dict[str, Any]:
        return claim_doc(guid, f"BUSY-{guid}")

    def prepare_copies(self, docs: Sequence[dict[str, Any]]) -> None:
        r = cli(self.url, "mq", "topology", "--retry-delays", "2s")
        assert r.returncode == 0, r.stderr
        publish(self.url, *write_claims(self.folder, docs))

    def consume_copies(self, db: Path, claim: str, **env: str) -> subprocess.CompletedProcess[str]:
        return cli(self.url, "mq", "consume", "--claim", claim, "--db", str(db), "--json",
                   "--until-empty", "--prefetch", "1", *self.COPY_POLICY, **env)  # fmt: skip

    def inventory(self, db: Path) -> Counter[str]:
        # One connection, tier first: a copy held unacked does not expire, so none moves
        # from the tier into claim.in between the two looks and none is missed.
        import pika

        found: Counter[str] = Counter()
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            ch = conn.channel()
            for queue in (self.TIER, "claim.in", "claim.dead"):
                while True:
                    method, _props, body = ch.basic_get(queue, auto_ack=False)
                    if method is None:
                        break
                    found[json.loads(body)["guid"]] += 1
        finally:
            conn.close()  # everything taken goes back where it was
        found.update(g for (g,) in rows(db, "SELECT msg_id FROM messages"))
        return found

    def copies_left(self) -> int:
        return queues(self.url, exact=True)[self.TIER][0]


class Nats(Broker):
    kind = "nats"
    copy_point = "after-dead-publish"

    def __init__(self, names: nats_support.Names, folder: Path) -> None:
        self.names, self.folder = names, folder

    def prepare(
        self, docs: Sequence[dict[str, Any]], resent: Sequence[dict[str, Any]] = ()
    ) -> None:
        nats_support.setup(self.names, ack_wait=NATS_ACK_WAIT)
        items = [(json.dumps(d).encode(), {"Nats-Msg-Id": d["guid"]}) for d in docs]
        items += [(json.dumps(d).encode(), {}) for d in resent]
        acks = nats_support.publish(self.names, items)
        assert not any(a.duplicate for a in acks), acks  # every copy stored

    def consume(
        self, db: Path, claim: str, *args: str, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return run_cli(*self._argv(db, claim), "--until-empty", *EXERCISE, *args,
                       env={"ONCEQ_NATS_URL": self.names.url, **env}, timeout=120)  # fmt: skip

    def start(self, db: Path, claim: str, *args: str) -> subprocess.Popen[str]:
        n = self.names
        return subprocess.Popen(
            [sys.executable, "-m", "onceq", *self._argv(db, claim), *EXERCISE, *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "ONCEQ_NATS_URL": n.url},
        )  # fmt: skip

    def _argv(self, db: Path, claim: str) -> list[str]:
        n = self.names
        return ["nats", "consume", "--stream", n.stream, "--durable", n.durable,
                "--url", f"{claim}/v1/claims", "--id-field", "guid", "--success", "201",
                "--reject", "422", "--db", str(db), "--json"]  # fmt: skip

    def returned(self, held: int = 1) -> None:
        # A killed consumer's copies stay ack-pending until a pull after their AckWait
        # gets them redelivered: the next run waits for exactly that (--until-empty
        # ends only once nothing is ack-pending). Here: the server lists no more than
        # the dead process could hold (its prefetch).
        assert self.state()["unacked"] <= held

    def state(self) -> dict[str, int]:
        s = nats_support.consumer_state(self.names)
        # Work-queue retention: an acked message leaves the stream; one still stored
        # and no longer pending nor ack-pending would be in no one's hands.
        return {"ready": s["pending"], "unacked": s["ack_pending"], "dead": s["dead"],
                "stored": s["stored"]}  # fmt: skip

    def dead_ids(self) -> list[str]:
        return sorted(json.loads(body)["guid"] for body, _ in nats_support.dead_letters(self.names))

    # The window: a group's dead letters stored (PubAck), the originals not yet acked.
    # A claim the stub answers 422 is dead at once; a second dead letter of the same
    # stored message is dropped by the dead stream's duplicate window: dead once.
    COPY_POLICY = ("--no-breaker",)

    def copy_doc(self, guid: str) -> dict[str, Any]:
        return claim_doc(guid, docs=[])

    def prepare_copies(self, docs: Sequence[dict[str, Any]]) -> None:
        self.prepare(docs)

    def consume_copies(self, db: Path, claim: str, **env: str) -> subprocess.CompletedProcess[str]:
        return self.consume(db, claim, "--prefetch", "1", *self.COPY_POLICY, **env)

    def inventory(self, db: Path) -> Counter[str]:
        found: Counter[str] = Counter()
        for body, _ in [*nats_support.stored(self.names), *nats_support.dead_letters(self.names)]:
            found[json.loads(body)["guid"]] += 1
        found.update(g for (g,) in rows(db, "SELECT msg_id FROM messages"))
        return found

    def copies_left(self) -> int:
        return 0  # a delay is a NAK: no copy outside the stream


def empty(broker: Broker) -> dict[str, int]:
    """The state of a drained queue with no dead letters, in the broker's own keys."""
    return {"ready": 0, "unacked": 0, "dead": 0, **({"stored": 0} if broker.kind == "nats" else {})}


@pytest.fixture(name="broker", params=KINDS)
def broker_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker]:
    """A Broker of each kind: its vhost or its stream names, fresh for the test."""
    if request.param == "amqp":
        yield Rabbit(request.getfixturevalue("amqp_url"), tmp_path / "claims")
    else:
        yield Nats(request.getfixturevalue("nats_names"), tmp_path / "claims")
