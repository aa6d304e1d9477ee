"""Issue 8's done-when on RabbitMQ: a partner outage does not empty the queue into the
dead letters.

200 claims queued; `onceq mq consume --claim …` with its defaults (1 immediate retry,
tiers 5s/30s/2m/10m, the breaker on); the claim system down for the first 12 s of the
run (connections refused, or 503, or calls that hang past --timeout), then back by
itself. At most 10 claims may end dead, and within 30 s of the partner's return every
other claim is called once (the stub's by_guid, which counts only the calls its rules
answered) and recorded once, with every queue empty.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from mq_support import claim_doc, cli, partner, queues, rows, start_consumer, write_claims

pytestmark = pytest.mark.broker

N = 200
DOWN_S = 12
WITHIN_S = 30  # from the partner's return to the last claim recorded and the queues empty
MAX_DEAD = 10


@pytest.mark.parametrize(
    ("mode", "args"),
    [("refuse", ()), ("503", ()), ("hang", ("--timeout", "2"))],
)
def test_an_outage_of_12s_kills_at_most_10_and_the_rest_goes_through_once(
    amqp_url: str, tmp_path: Path, mode: str, args: tuple[str, ...]
) -> None:
    guids = [f"o-{i:03d}" for i in range(N)]
    r = cli(amqp_url, "mq", "topology")  # the default policy's tiers
    assert r.returncode == 0, r.stderr
    r = cli(amqp_url, "mq", "publish",
            *map(str, write_claims(tmp_path / "c", [claim_doc(g) for g in guids])))  # fmt: skip
    assert r.returncode == 0, r.stderr
    db = tmp_path / "p.db"
    with partner(args=("--down-for", str(DOWN_S), "--down-as", mode)) as p:
        assert p.proc.stdout is not None
        assert p.proc.stdout.readline().startswith(f"claim system stub down ({mode})")
        back: list[float] = []

        def watch() -> None:  # the stub prints one line when it is back
            line = p.proc.stdout.readline()  # type: ignore[union-attr]
            back.append(time.monotonic())
            assert line.strip() == "claim system stub back up", line

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        # The run starts while the partner is down: the outage is its first 12 s.
        proc = start_consumer(amqp_url, p.url, db, "--until-empty", *args, policy=())
        try:
            out, err = proc.communicate(timeout=DOWN_S + WITHIN_S + 60)
        finally:
            if proc.poll() is None:
                proc.kill()
        ended = time.monotonic()
        watcher.join(timeout=10)
        stats = p.stats()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert back, "the partner never came back"
    took = ended - back[0]
    dead = summary["dead"]
    # The figures, for `pytest -s`: how long the drain took after the return.
    print(f"\n{mode}: drained {took:.1f}s after the partner's return; dead {dead},"
          f" held {summary['held']}, requeued {summary['requeued']}")  # fmt: skip
    # Not emptied into the dead letters: the breaker held the queue while it was down.
    assert dead <= MAX_DEAD, summary
    assert summary["drained"] is True
    # Within 30 s of the partner's return: every other claim called and recorded once.
    assert took <= WITHIN_S, (took, summary)
    recorded = [g for (g,) in rows(db, "SELECT msg_id FROM messages ORDER BY msg_id")]
    dead_ids = {g for (g,) in rows(db, "SELECT msg_id FROM failures WHERE action = 'dead'")}
    assert len(dead_ids) == dead and sorted(set(guids) - dead_ids) == recorded
    assert {g: stats["by_guid"].get(g) for g in recorded} == dict.fromkeys(recorded, 1)
    depths = queues(amqp_url, exact=True)
    assert depths["claim.dead"] == (dead, 0)
    assert all(v == (0, 0) for k, v in depths.items() if k != "claim.dead"), depths
    # The breaker said so, once per change, and nothing was lost on the way.
    assert "breaker open" in err and summary["held"] >= 0
    assert summary["processed"] == N - dead
