"""`onceq mq dead list|replay|purge` against the real broker, stub and ledger.

Each test gets a vhost of its own holding, in claim.dead: three claims the stub
refused (422, one call each), two BUSY claims (503, two calls each, the exercise's
rule) and one message put there by hand (no ledger row, no x-death).
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mq_dead_support import (
    busy,
    consume_exercise,
    depth,
    foreign_dead_letter,
    ids_in,
    ledger_dump,
    make_dead,
    rejected,
    run_dead,
    table,
)
from mq_support import Partner, broker_state, get_all, partner, publish, topology, write_claims

pytestmark = pytest.mark.broker

REJECTED = ["rej-0", "rej-1", "rej-2"]
BUSY = ["busy-0", "busy-1"]
FOREIGN = "foreign-0"


@dataclass
class Dead:
    url: str
    db: Path
    stub: Partner
    tmp: Path

    def cli(self, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        return run_dead(self.url, *args, "--db", str(self.db), **kw)  # type: ignore[arg-type]

    def json(self, *args: str) -> dict:
        r = self.cli(*args, "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)


@pytest.fixture
def dead(amqp_url: str, tmp_path: Path) -> Iterator[Dead]:
    topology(amqp_url)
    db = tmp_path / "processed.db"
    with partner() as stub:
        docs = [rejected(g) for g in REJECTED] + [busy(g) for g in BUSY]
        make_dead(amqp_url, tmp_path / "claims", stub.url, db, docs)
        foreign_dead_letter(amqp_url, FOREIGN)
        assert sorted(ids_in(amqp_url, "claim.dead")) == sorted([*REJECTED, *BUSY, FOREIGN])
        yield Dead(amqp_url, db, stub, tmp_path)


def calls(stub: Partner, guid: str) -> int:
    return int(stub.stats()["by_guid"].get(guid, 0))


def failed_attempts(db: Path, msg_id: str) -> int:
    from onceq._ledger.sqlite import Ledger

    with Ledger(db, "amqp", create=False) as ledger:
        return ledger.failed_attempts(msg_id)


# --- list --------------------------------------------------------------------------


def test_list_shows_ledger_reason_attempts_x_death_and_size(dead: Dead) -> None:
    before = get_all(dead.url, "claim.dead")
    doc = dead.json("list")
    assert (doc["queue"], doc["total"], doc["matched"]) == ("claim.dead", 6, 6)
    by_id = {x["message_id"]: x for x in doc["letters"]}
    assert [x["message_id"] for x in doc["letters"]] == [p.message_id for _m, p, _b in before]
    assert [x["position"] for x in doc["letters"]] == list(range(6))
    for guid in REJECTED:
        x = by_id[guid]
        assert (x["reason"], x["attempts"], x["in_ledger"]) == ("http-422", 1, True)
    for guid in BUSY:
        assert (by_id[guid]["reason"], by_id[guid]["attempts"]) == ("http-503", 2)
    for guid in [*REJECTED, *BUSY]:
        (death,) = by_id[guid]["x_death"]
        assert (death["queue"], death["reason"], death["count"]) == ("claim.in", "rejected", 1)
        assert by_id[guid]["dead_at"] is not None
    f = by_id[FOREIGN]
    assert (f["reason"], f["attempts"], f["in_ledger"], f["x_death"]) == (
        "unknown",
        None,
        False,
        [],
    )
    sizes = {p.message_id: len(b) for _m, p, b in before}
    assert {k: v["size"] for k, v in by_id.items()} == sizes
    # Nothing removed, nothing reordered, nothing left unacked.
    after = get_all(dead.url, "claim.dead")
    assert [(p.message_id, b) for _m, p, b in after] == [(p.message_id, b) for _m, p, b in before]
    assert depth(dead.url)["claim.dead"] == (6, 0)


def test_list_human_table_and_summary(dead: Dead) -> None:
    r = dead.cli("list")
    assert r.returncode == 0, r.stderr
    for word in ("message_id", "x-death", "http-422", "http-503", "unknown", *REJECTED, FOREIGN):
        assert word in r.stdout, word
    assert r.stdout.rstrip().endswith("6 of 6 dead letter(s) in claim.dead shown; nothing removed")
    assert depth(dead.url)["claim.dead"] == (6, 0)


def test_list_filters(dead: Dead) -> None:
    order = ids_in(dead.url, "claim.dead")

    def shown(*args: str) -> list[str]:
        return [x["message_id"] for x in dead.json("list", *args)["letters"]]

    assert sorted(shown("--reason", "http-503")) == sorted(BUSY)
    assert shown("--reason", "unknown") == [FOREIGN]
    assert shown("--reason", "nope") == []
    assert shown("--limit", "2") == order[:2]
    # --since: the ledger's time of death, else x-death's; the hand-made one has neither.
    assert sorted(shown("--since", "1h")) == sorted([*REJECTED, *BUSY])
    assert shown("--since", "2999-01-01T00:00:00Z") == []
    assert sorted(shown("--since", "2000-01-01")) == sorted([*REJECTED, *BUSY])
    assert ids_in(dead.url, "claim.dead") == order


# --- replay ------------------------------------------------------------------------


def test_replay_reason_moves_exactly_those_and_resets_their_attempts(dead: Dead) -> None:
    order = ids_in(dead.url, "claim.dead")
    assert all(failed_attempts(dead.db, g) == 2 for g in BUSY)
    doc = dead.json("replay", "--reason", "http-503")
    assert (doc["done"], doc["matched"], doc["left"], doc["dry_run"]) == (2, 2, 4, False)
    assert sorted(doc["ids"]) == sorted(BUSY)
    assert sorted(ids_in(dead.url, "claim.in")) == sorted(BUSY)
    assert ids_in(dead.url, "claim.dead") == [g for g in order if g not in BUSY]
    # The replayed copy: the same body and id, persistent, x-onceq-copy kept, x-death gone.
    for _m, p, b in get_all(dead.url, "claim.in"):
        assert json.loads(b)["guid"] == p.message_id and p.delivery_mode == 2
        assert "x-death" not in p.headers and p.headers["onceq-replays"] == 1
        assert len(p.headers["x-onceq-copy"]) == 32
    assert all(failed_attempts(dead.db, g) == 0 for g in BUSY)
    assert all(failed_attempts(dead.db, g) == 1 for g in REJECTED)
    (op,) = table(dead.db, "SELECT transport, op, filter, queue, count, finished_at FROM dead_ops")
    assert op[:5] == ("amqp", "replay", json.dumps({"reason": "http-503"}), "claim.dead", 2)
    assert op[5] is not None and doc["op"] is not None
    replays = table(dead.db, "SELECT msg_id, op FROM replays ORDER BY msg_id")
    assert replays == [(g, doc["op"]) for g in sorted(BUSY)]
    # They get their retries again: two more calls each (without the reset, one), then dead.
    consume_exercise(dead.url, dead.stub.url, dead.db)
    assert [calls(dead.stub, g) for g in BUSY] == [4, 4]
    assert sorted(ids_in(dead.url, "claim.dead")) == sorted(order)
    assert all(failed_attempts(dead.db, g) == 2 for g in BUSY)


def test_replay_ids_and_an_id_not_there(dead: Dead) -> None:
    r = dead.cli("replay", "--id", REJECTED[1], "--id", FOREIGN, "--id", "no-such-id", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert sorted(doc["ids"]) == sorted([REJECTED[1], FOREIGN])
    assert doc["missing"] == ["no-such-id"]
    assert "no-such-id" in r.stderr and r.stderr.count("\n") == 1
    assert sorted(ids_in(dead.url, "claim.in")) == sorted([REJECTED[1], FOREIGN])
    assert sorted(ids_in(dead.url, "claim.dead")) == sorted([REJECTED[0], REJECTED[2], *BUSY])


def test_replay_all_human_summary(dead: Dead) -> None:
    r = dead.cli("replay", "--all")
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip()
    head = "replayed 6 of 6 dead letter(s) from claim.dead to eai.claim, key claim; filter all"
    assert line.startswith(head + "; 0 left; "), line
    assert re.search(r"; \d+\.\ds; ledger op \d+$", line), line
    assert depth(dead.url) == {"claim.in": (6, 0), "claim.dead": (0, 0)}


def test_a_replayed_message_already_processed_is_a_duplicate(dead: Dead) -> None:
    """A twin (a copy already processed, also in claim.dead) is acked without a call."""
    done = "done-0"
    publish(dead.url, *write_claims(dead.tmp / "ok", [{"guid": done, "claimId": "CL-x",
                                                         "amount": 1, "docs": ["a"]}]))  # fmt: skip
    consume_exercise(dead.url, dead.stub.url, dead.db)
    assert calls(dead.stub, done) == 1
    foreign_dead_letter(dead.url, done)  # the same message, dead as well
    doc = dead.json("replay", "--id", done)
    assert doc["done"] == 1
    result = consume_exercise(dead.url, dead.stub.url, dead.db)
    assert calls(dead.stub, done) == 1  # not applied again
    stats = result.stats["default"]
    assert (stats.duplicates, stats.processed) == (1, 0)
    assert depth(dead.url)["claim.in"] == (0, 0)


def test_dry_run_changes_nothing(dead: Dead) -> None:
    before_q = get_all(dead.url, "claim.dead")
    before_db = ledger_dump(dead.db)
    r = dead.cli("replay", "--all", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("dry run: would have replayed 6 of 6 dead letter(s)")
    assert r.stdout.rstrip().endswith("nothing changed") and REJECTED[0] in r.stdout
    doc = dead.json("replay", "--reason", "http-422", "--dry-run")
    assert sorted(doc["ids"]) == sorted(REJECTED) and (doc["done"], doc["op"]) == (0, None)
    after_q = get_all(dead.url, "claim.dead")
    assert [(p.message_id, b) for _m, p, b in after_q] == [
        (p.message_id, b) for _m, p, b in before_q
    ]
    assert depth(dead.url) == {"claim.in": (0, 0), "claim.dead": (6, 0)}
    assert ledger_dump(dead.db) == before_db


def test_rate_paces_the_replay(amqp_url: str, tmp_path: Path) -> None:
    n, rate = 15, 10.0
    topology(amqp_url)
    db = tmp_path / "processed.db"
    with partner() as stub:
        make_dead(amqp_url, tmp_path / "c", stub.url, db, [rejected(f"r{i}") for i in range(n)])
    start = time.monotonic()
    r = run_dead(amqp_url, "replay", "--all", "--rate", str(rate), "--db", str(db), "--json")
    wall = time.monotonic() - start
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["done"] == n
    # n publishes at most `rate` per second: the last one no earlier than (n-1)/rate.
    assert doc["seconds"] >= (n - 1) / rate
    assert wall >= (n - 1) / rate
    assert wall < (n - 1) / rate + 20  # paced, not stuck (a loaded 2-core machine)
    assert depth(amqp_url) == {"claim.in": (n, 0), "claim.dead": (0, 0)}


# --- refusals ----------------------------------------------------------------------


REFUSALS = [
    (("replay",), 2, "give --all, --id ID… or --reason R"),
    (("replay", "--all", "--reason", "http-503"), 2, "--all and --reason"),
    (("replay", "--id", "x", "--all"), 2, "--all and --id"),
    (("replay", "--all", "--rate", "0"), 2, "--rate"),
    (("replay", "--all", "--rate", "-3"), 2, "--rate"),
    (("replay", "--all", "--rate", "nan"), 2, "--rate"),
    (("replay", "--all", "--rate", "inf"), 2, "--rate"),
    (("purge", "--reason", "http-422"), 2, "--yes"),
    (("purge", "--yes"), 2, "give --all"),
    (("replay", "--all", "--queue", "nope.in"), 3, "nope.dead"),
    (("purge", "--all", "--yes", "--queue", "nope.in"), 3, "nope.dead"),
    (("list", "--queue", "nope.in"), 3, "declare it first: onceq mq topology --queue nope.in"),
    (("replay", "--all", "--exchange", "no-such-exchange"), 3, "no-such-exchange"),
    (("list", "--since", "yesterday"), 2, "--since"),
    (("list", "--id-field", "x"), 2, "--id-field"),
    (("list", "--limit", "0"), 2, "--limit"),
    (("list", "--queue", "amq.x"), 2, "--queue"),
]


def test_refusals_change_nothing(dead: Dead) -> None:
    """Each refusal: its exit code, one line naming the problem, and nothing changed —
    the broker's objects, the dead letters and their order, the ledger's every row."""
    state, before_q = broker_state(dead.url), ids_in(dead.url, "claim.dead")
    before_db = ledger_dump(dead.db)
    for args, code, words in REFUSALS:
        r = dead.cli(*args)
        assert r.returncode == code, (args, r.returncode, r.stdout, r.stderr)
        assert r.stderr.startswith("onceq: ") and r.stderr.count("\n") == 1, (args, r.stderr)
        assert words in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert depth(dead.url) == {"claim.in": (0, 0), "claim.dead": (6, 0)}, args
    assert broker_state(dead.url) == state
    assert ids_in(dead.url, "claim.dead") == before_q
    assert ledger_dump(dead.db) == before_db


def test_a_missing_ledger_is_refused_and_not_created(dead: Dead) -> None:
    nowhere = dead.tmp / "other.db"
    for args in (("list",), ("replay", "--all"), ("purge", "--all", "--yes")):
        r = run_dead(dead.url, *args, "--db", str(nowhere))
        assert r.returncode == 3, r.stderr
        assert "no ledger here" in r.stderr and not nowhere.exists()
    assert depth(dead.url)["claim.dead"] == (6, 0)


# --- purge -------------------------------------------------------------------------


def test_purge_with_yes_deletes_those_and_records_their_ids(dead: Dead) -> None:
    doc = dead.json("purge", "--reason", "http-422", "--yes")
    assert (doc["done"], doc["left"], doc["declined"]) == (3, 3, False)
    assert sorted(ids_in(dead.url, "claim.dead")) == sorted([*BUSY, FOREIGN])
    assert depth(dead.url)["claim.in"] == (0, 0)
    (op,) = table(dead.db, "SELECT op, filter, count, ids, finished_at FROM dead_ops")
    assert op[:3] == ("purge", json.dumps({"reason": "http-422"}), 3)
    assert sorted(json.loads(op[3])) == sorted(REJECTED) and op[4] is not None


def test_purge_dry_run_changes_nothing(dead: Dead) -> None:
    before = ledger_dump(dead.db)
    doc = dead.json("purge", "--all", "--dry-run")
    assert (doc["matched"], doc["done"], doc["op"]) == (6, 0, None)
    assert depth(dead.url)["claim.dead"] == (6, 0) and ledger_dump(dead.db) == before


def _purge_on_a_terminal(dead: Dead, answer: bytes, *args: str) -> tuple[int, str]:
    """Run purge with a terminal on stdin and type `answer` at its question."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "onceq", "mq", "dead", "purge", *args,
             "--db", str(dead.db)],
            stdin=follower,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "EAI_AMQP_URL": dead.url},
        )  # fmt: skip
        os.write(leader, answer)
        out, err = proc.communicate(timeout=120)
        return proc.returncode, (out + err).decode()
    finally:
        os.close(leader)
        os.close(follower)


def test_purge_asks_on_a_terminal(dead: Dead) -> None:
    code, out = _purge_on_a_terminal(dead, b"n\n", "--reason", "unknown")
    assert code == 0, out
    assert "delete 1 dead letter(s) from claim.dead for good?" in out and "declined" in out
    assert depth(dead.url)["claim.dead"] == (6, 0)
    assert table(dead.db, "SELECT count(*) FROM dead_ops") == [(0,)]
    code, out = _purge_on_a_terminal(dead, b"y\n", "--reason", "unknown")
    assert code == 0, out
    assert "purged 1 of 6" in out
    assert FOREIGN not in ids_in(dead.url, "claim.dead")
    assert depth(dead.url)["claim.dead"] == (5, 0)


def test_an_unroutable_copy_keeps_the_dead_letter(dead: Dead) -> None:
    """No queue bound for the work key: the broker returns the copy (mandatory), the
    replay stops with exit 6, and the dead letters are all still there."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(dead.url))
    try:
        conn.channel().queue_unbind("claim.in", "eai.claim", "claim")
    finally:
        conn.close()
    order = ids_in(dead.url, "claim.dead")
    r = dead.cli("replay", "--reason", "http-503")
    assert r.returncode == 6, (r.stdout, r.stderr)
    assert r.stderr.startswith("onceq: exchange eai.claim: returned the replayed copy")
    assert "it stays in claim.dead" in r.stderr and r.stderr.count("\n") == 1
    assert ids_in(dead.url, "claim.dead") == order
    assert depth(dead.url) == {"claim.in": (0, 0), "claim.dead": (6, 0)}
