"""`onceq mq consume --until-empty`: a batch that ends when claim.in is drained.

Against the real broker (a temporary vhost each) and the real claim-system stub.
Drained means: nothing ready in claim.in and every delivery this consumer took is
settled — including messages this very run requeued for their retry, which the
broker hands straight back. A batch stopped before that exits 130/143 (or 1 when
--max-seconds ran out), and leaves everything it did not finish in claim.in.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from mq_support import (
    CLAIMS,
    EXERCISE,
    claim_doc,
    consume,
    partner,
    publish,
    queues,
    rows,
    start_consumer,
    topology,
    wait_for,
    write_claims,
)
from onceq._core.consumer import Consumer, Outcome
from onceq._core.transport import Delivery, Kind
from onceq._ledger.sqlite import Ledger


def test_the_sample_is_drained_retries_included_and_the_batch_exits_0(
    amqp_url: str, tmp_path: Path
) -> None:
    topology(amqp_url)
    publish(amqp_url, *sorted(CLAIMS.glob("*.json")))
    db = tmp_path / "p.db"
    with partner() as p:
        r = consume(amqp_url, p.url, db, "--until-empty")
        calls = p.stats()["by_claim"]
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["drained"] is True
    # 6 processed, 1 re-sent copy, no-docs dead at once, BUSY requeued then dead.
    assert (out["processed"], out["duplicates"], out["requeued"], out["dead"]) == (6, 1, 1, 2)
    assert out["received"] == 10  # 9 published + the BUSY claim's redelivery
    assert calls["BUSY-2026-1008"] == 2
    assert queues(amqp_url) == {"claim.in": (0, 0), "claim.dead": (2, 0)}
    assert rows(db, "SELECT count(*) FROM processed") == [(6,)]


def test_an_empty_queue_ends_the_batch_at_once(amqp_url: str, tmp_path: Path) -> None:
    topology(amqp_url)
    with partner() as p:
        r = consume(amqp_url, p.url, tmp_path / "p.db", "--until-empty")
        assert p.stats()["total"] == 0
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["drained"] is True


def test_human_summary_says_drained(amqp_url: str, tmp_path: Path) -> None:
    topology(amqp_url)
    publish(amqp_url, CLAIMS / "claim-001.json")
    with partner() as p:
        from mq_support import cli

        r = cli(
            amqp_url, "mq", "consume", "--claim", p.url, "--db", str(tmp_path / "p.db"),
            "--until-empty", *EXERCISE,
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "1 processed" in r.stdout and "claim.in drained" in r.stdout


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_batch_stopped_by_a_signal_exits_128_plus_it_and_loses_nothing(
    amqp_url: str, tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    topology(amqp_url)
    n = 30
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc(f"g-{i:03d}") for i in range(n)]))
    db = tmp_path / "p.db"
    with partner(delay=0.3) as p:
        proc = start_consumer(amqp_url, p.url, db, "--until-empty", "--prefetch", "2")
        # A call is under way: the batch has started and is far from drained (30 x 0.3 s
        # at 2 at once), whatever the machine's speed.
        wait_for(lambda: p.stats()["total"] >= 1, timeout=30)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        calls = p.stats()["by_guid"]
    assert proc.returncode == code, err
    # The last line (a first line may announce the new ledger).
    last = err.splitlines()[-1]
    assert last.startswith(f"onceq: stopped by {sig.name} before claim.in was drained"), err
    summary = json.loads(out)
    assert summary["drained"] is False
    done = rows(db, "SELECT count(*) FROM processed")[0][0]
    assert 1 <= done < n and summary["processed"] == done
    # Nothing lost: what was not recorded is back in claim.in, nothing left unacked.
    assert queues(amqp_url)["claim.in"] == (n - done, 0)
    assert set(calls.values()) == {1}  # no call twice
    # Every call that started (those in flight at the signal included) finished and
    # was recorded and acked: a graceful stop abandons no call half-way.
    assert sum(calls.values()) == done


def test_a_deadline_before_the_queue_is_drained_exits_1(amqp_url: str, tmp_path: Path) -> None:
    topology(amqp_url)
    n = 20
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc(f"d-{i:03d}") for i in range(n)]))
    db = tmp_path / "p.db"
    with partner(delay=1.0) as p:  # 20 calls of 1 s, one at a time: never within 1 s
        r = consume(amqp_url, p.url, db, "--until-empty", "--prefetch", "1", "--max-seconds", "1")
    assert r.returncode == 1, r.stderr
    assert "claim.in not drained within --max-seconds 1" in r.stderr
    assert json.loads(r.stdout)["drained"] is False
    done = rows(db, "SELECT count(*) FROM processed")[0][0]
    assert queues(amqp_url)["claim.in"] == (n - done, 0)


def test_plain_consume_has_no_drained_field(amqp_url: str, tmp_path: Path) -> None:
    topology(amqp_url)
    with partner() as p:
        r = consume(amqp_url, p.url, tmp_path / "p.db", "--max-seconds", "0.5")
    assert r.returncode == 0, r.stderr
    assert "drained" not in json.loads(r.stdout)


class FailsFirst:
    """Every message fails transiently on its first call and succeeds on its second."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    async def __call__(self, d: Delivery, fields: dict[str, Any]) -> Outcome:
        assert d.msg_id is not None
        self.calls[d.msg_id] += 1
        if self.calls[d.msg_id] == 1:
            return Outcome(Kind.TRANSIENT, "http-503")
        return Outcome(Kind.SUCCESS, fields=fields)


def test_a_drain_check_meeting_deliveries_in_flight_never_ends_early(
    amqp_url: str, tmp_path: Path
) -> None:
    """The hardest case for "drained": messages delivered to this consumer (unacked,
    so not ready) but not yet handed to the loop when the check runs — a message
    requeued by this run and on its way back is one. Built here by construction: the
    first copy of each message reaches the client and is held back, as if still in
    flight. A ready count alone says 0 and would end the batch with every message
    unhandled; the run must handle each (a transient failure, its retry, success)."""
    from onceq._exercise import claims_0_1_0 as claim
    from onceq._sources.amqp.transport import AmqpTransport

    class InFlight(AmqpTransport):
        def __init__(self) -> None:
            super().__init__(amqp_url, prefetch=20, until_empty=True)
            self.held_back: set[str] = set()

        async def _on_message(self, message: Any) -> None:
            if message.message_id not in self.held_back:
                self.held_back.add(message.message_id)  # never handed out: still "in flight"
                return
            await super()._on_message(message)

    topology(amqp_url)
    n = 8
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc(f"r-{i:03d}") for i in range(n)]))
    handler = FailsFirst()

    async def go() -> tuple[Any, Any]:
        t = InFlight()
        await t.open()
        await t.start()
        try:
            with Ledger(tmp_path / "p.db", source="amqp") as ledger:
                c = Consumer(t, ledger, claim.decode, handler, max_in_flight=20, max_group=4)
                stats = await asyncio.wait_for(c.run(), 120)
        finally:
            await t.close()
        return t, stats

    t, stats = asyncio.run(go())
    assert len(t.held_back) == n  # every message was first held back
    assert stats.processed == n and stats.requeued == n and stats.dead == 0
    assert set(handler.calls.values()) == {2} and len(handler.calls) == n
    assert queues(amqp_url) == {"claim.in": (0, 0), "claim.dead": (0, 0)}
    assert t.drained and t.drain_races >= 1  # the recover found what a ready count missed
