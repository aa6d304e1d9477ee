"""kill -9 inside a DELAY settle: between the tier copy's confirm and the original's ack.

There the message exists twice (the unacked original and its confirmed copy), never
zero times. After the kill every message is in a queue or in the ledger; a second
run finishes the batch, calls each good claim once, and the retried ones end dead
(at worst twice: the original and its copy each reach their last attempt).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mq_support import claim_doc, cli, partner, queues, rows, wait_for, write_claims

pytestmark = pytest.mark.broker

TIER = "claim.retry.2s"
POLICY = ("--retry-delays", "2s", "--immediate-retries", "0", "--no-breaker")


def _inventory(url: str, db: Path) -> dict[str, int]:
    """{guid: copies} over the tier, claim.in, claim.dead and the ledger's messages.

    One connection, tier first: a copy held unacked does not expire, so none moves
    from the tier into claim.in between the two looks and none is missed.
    """
    import pika

    found: dict[str, int] = {}
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        for queue in (TIER, "claim.in", "claim.dead"):
            while True:
                method, _props, body = ch.basic_get(queue, auto_ack=False)
                if method is None:
                    break
                guid = json.loads(body)["guid"]
                found[guid] = found.get(guid, 0) + 1
    finally:
        conn.close()  # everything taken goes back where it was
    for (guid,) in rows(db, "SELECT msg_id FROM messages"):
        found[guid] = found.get(guid, 0) + 1
    return found


@pytest.mark.parametrize("after", [1, 3])
def test_killed_between_the_copys_confirm_and_the_ack_loses_nothing(
    amqp_url: str, tmp_path: Path, after: int
) -> None:
    good = [f"ok-{i:02d}" for i in range(8)]
    busy = [f"busy-{i:02d}" for i in range(4)]  # the stub answers 503 to BUSY claims
    docs = [claim_doc(g) for g in good] + [claim_doc(g, f"BUSY-{g}") for g in busy]
    docs.sort(key=lambda d: d["guid"][-2:])  # interleaved: groups mix both kinds
    r = cli(amqp_url, "mq", "topology", "--retry-delays", "2s")
    assert r.returncode == 0, r.stderr
    r = cli(amqp_url, "mq", "publish", *map(str, write_claims(tmp_path / "c", docs)))
    assert r.returncode == 0, r.stderr
    db = tmp_path / "p.db"
    # prefetch 1: no other call is under way when the process kills itself, so "each
    # good claim called once" is a promise the run can keep (a call in flight at a
    # kill is repeated: the at-least-once part, which Idempotency-Key covers).
    args = ("mq", "consume", "--db", str(db), "--json", "--until-empty", "--prefetch", "1",
            *POLICY)  # fmt: skip
    with partner() as p:
        first = cli(amqp_url, *args, "--claim", p.url, ONCEQ_FAULT="after-delay-publish",
                    ONCEQ_FAULT_AFTER=str(after))  # fmt: skip
        assert first.returncode == -9, (first.returncode, first.stderr)
        # The broker saw the connection die: what was unacked is back in claim.in.
        wait_for(lambda: queues(amqp_url, exact=True)["claim.in"][1] == 0, timeout=30, step=0.3)
        after_kill = _inventory(amqp_url, db)
        # Nothing lost: every message is somewhere; a copy in flight is there twice.
        assert set(after_kill) == set(good) | set(busy), after_kill
        # The kill came after the copy was confirmed, before the original's ack: that
        # busy claim is there twice (original + copy), every other once.
        doubled = {g for g, n in after_kill.items() if n > 1}
        assert len(doubled) == 1 and doubled <= set(busy), after_kill
        assert max(after_kill.values()) == 2

        second = cli(amqp_url, *args, "--claim", p.url)
        calls = p.stats()["by_guid"]
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["drained"] is True
    # Each good claim was called once and recorded once, across the kill.
    assert {g: calls[g] for g in good} == dict.fromkeys(good, 1)
    assert sorted(g for (g,) in rows(db, "SELECT msg_id FROM messages")) == good
    # Each busy claim is dead, no copy left behind; one that was in flight at the
    # kill may be dead twice (its original and its copy), never zero times.
    final = _inventory(amqp_url, db)
    assert {g: final[g] for g in busy} == {g: 2 if g in doubled else 1 for g in busy}
    assert queues(amqp_url, exact=True)["claim.in"] == (0, 0) and queues(amqp_url, exact=True)[
        TIER
    ] == (0, 0)
