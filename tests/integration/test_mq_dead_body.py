"""A dead letter repaired: `onceq mq dead show ID` writes its body, `onceq mq dead replay
--id ID --body FILE` sends a corrected copy — against the real broker, stub and ledger.

Each test's vhost holds, in claim.dead, two claims the stub refused (422: no docs).
The corrected body gives the claim its docs, so the stub takes it (201).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mq_dead_support import (
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
from mq_support import Partner, claim_doc, get_all, partner, topology

pytestmark = pytest.mark.broker

REJECTED = ["rej-0", "rej-1"]


@dataclass
class Dead:
    url: str
    db: Path
    stub: Partner
    tmp: Path

    def cli(self, *args: str):  # type: ignore[no-untyped-def]
        return run_dead(self.url, *args, "--db", str(self.db))

    def fixed(self, doc: dict, name: str = "fixed.json") -> Path:
        path = self.tmp / name
        path.write_text(json.dumps(doc, indent=2) + "\n")
        return path

    def unchanged(self) -> tuple[object, ...]:
        """What a refused command must leave as it was: queues (order, bodies), ledger."""
        dead_q = [(p.message_id, b) for _m, p, b in get_all(self.url, "claim.dead")]
        return dead_q, depth(self.url), ledger_dump(self.db)


@pytest.fixture
def dead(amqp_url: str, tmp_path: Path) -> Iterator[Dead]:
    topology(amqp_url)
    db = tmp_path / "processed.db"
    with partner() as stub:
        make_dead(amqp_url, tmp_path / "claims", stub.url, db, [rejected(g) for g in REJECTED])
        assert sorted(ids_in(amqp_url, "claim.dead")) == REJECTED
        yield Dead(amqp_url, db, stub, tmp_path)


def calls(stub: Partner, guid: str) -> int:
    return int(stub.stats()["by_guid"].get(guid, 0))


def test_show_writes_the_body_as_it_is_and_leaves_it(dead: Dead) -> None:
    before = dead.unchanged()
    bodies = {p.message_id: b for _m, p, b in get_all(dead.url, "claim.dead")}
    r = dead.cli("show", "rej-1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.encode() == bodies["rej-1"] and r.stderr == ""
    doc = json.loads(dead.cli("show", "rej-1", "--json").stdout)
    assert (doc["message_id"], doc["reason"], doc["attempts"]) == ("rej-1", "http-422", 1)
    assert (doc["body"].encode(), doc["utf8"], doc["same_id"]) == (bodies["rej-1"], True, 1)
    missing = dead.cli("show", "no-such-id")
    assert missing.returncode == 3
    assert missing.stderr == (
        "onceq: claim.dead: no dead letter with message_id 'no-such-id' (2 in it)\n"
    )
    assert dead.unchanged() == before


def test_show_escapes_bytes_that_are_not_utf8_and_names_twins(dead: Dead) -> None:
    """A body that cannot be printed as it is, and an id two dead letters share."""
    foreign_dead_letter(dead.url, "bin-0", b'{"guid": "bin-0", "note": "\xff"}')
    foreign_dead_letter(dead.url, "rej-1", b'{"guid": "rej-1", "second": true}')
    first = ids_in(dead.url, "claim.dead").index("rej-1")  # the consumer's order
    before = dead.unchanged()
    r = dead.cli("show", "bin-0")
    assert r.returncode == 0, r.stderr
    assert r.stdout == '{"guid": "bin-0", "note": "\\xff"}'
    assert r.stderr == "onceq: claim.dead: 'bin-0': its body is not UTF-8 (bytes as \\xNN)\n"
    r = dead.cli("show", "rej-1")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == rejected("rej-1")  # the one nearer the head
    assert r.stderr == (
        "onceq: claim.dead: 2 dead letters have message_id 'rej-1'; shown: the one at"
        f" position {first}\n"
    )
    assert json.loads(dead.cli("show", "rej-1", "--json").stdout)["same_id"] == 2
    assert dead.unchanged() == before


def test_replay_with_a_corrected_body_is_processed_once(dead: Dead) -> None:
    assert calls(dead.stub, "rej-0") == 1
    fixed = dead.fixed(claim_doc("rej-0"))  # docs given: the stub takes it
    r = dead.cli("replay", "--id", "rej-0", "--body", str(fixed), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["done"], doc["ids"], doc["left"]) == (1, ["rej-0"], 1)
    assert doc["body"]["file"] == str(fixed) and doc["body"]["bytes"] == len(fixed.read_bytes())
    # The dead letter is gone; its copy waits in claim.in with the corrected body, its
    # message_id kept, persistent, the broker's x-death dropped.
    assert ids_in(dead.url, "claim.dead") == ["rej-1"]
    ((_m, props, body),) = get_all(dead.url, "claim.in")
    assert (props.message_id, body, props.delivery_mode) == ("rej-0", fixed.read_bytes(), 2)
    assert "x-death" not in props.headers and props.headers["onceq-replays"] == 1
    # Audited like every replay: one dead_ops row naming the id and the body's hash.
    (op,) = table(dead.db, "SELECT id, op, filter, queue, count, finished_at FROM dead_ops")
    assert (op[0], op[1], op[3], op[4]) == (doc["op"], "replay", "claim.dead", 1)
    assert json.loads(op[2]) == {"ids": ["rej-0"], "body": doc["body"]}
    assert op[5] is not None
    assert table(dead.db, "SELECT msg_id, op FROM replays") == [("rej-0", doc["op"])]
    # Consumed: processed once (the stub's second call, a 201), nothing dead again.
    consume_exercise(dead.url, dead.stub.url, dead.db)
    assert calls(dead.stub, "rej-0") == 2
    assert table(dead.db, "SELECT msg_id FROM messages") == [("rej-0",)]
    assert depth(dead.url) == {"claim.in": (0, 0), "claim.dead": (1, 0)}
    listed = json.loads(dead.cli("list", "--json").stdout)
    assert [x["message_id"] for x in listed["letters"]] == ["rej-1"]
    # Once more: the ledger has it, so a second corrected copy would be a duplicate.
    consume_exercise(dead.url, dead.stub.url, dead.db)
    assert calls(dead.stub, "rej-0") == 2


def test_replay_body_human_line_and_dry_run(dead: Dead) -> None:
    fixed = dead.fixed(claim_doc("rej-1"))
    before = dead.unchanged()
    r = dead.cli("replay", "--id", "rej-1", "--body", str(fixed), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(
        "dry run: would have replayed 1 of 2 dead letter(s) from claim.dead to eai.claim,"
        f" key claim, body from {fixed}; filter id rej-1: rej-1; nothing changed"
    ), r.stdout
    assert dead.unchanged() == before
    r = dead.cli("replay", "--id", "rej-1", "--body", str(fixed))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(
        "replayed 1 of 2 dead letter(s) from claim.dead to eai.claim, key claim,"
        f" body from {fixed}; filter id rej-1; 1 left; "
    ), r.stdout


@pytest.mark.parametrize(
    ("doc", "code", "why"),
    [
        ({**claim_doc("rej-9")}, 5, "guid is 'rej-9', not 'rej-0': a corrected body keeps"),
        ({"claimId": "CL-rej-0", "docs": ["a.pdf"]}, 5, "no guid"),
        ("not json", 5, "not JSON"),
        (None, 3, "no such file"),
    ],
    ids=["another id", "no id", "not json", "no file"],
)
def test_a_body_that_is_not_the_messages_is_refused_and_nothing_changes(
    dead: Dead, doc: object, code: int, why: str
) -> None:
    path = dead.tmp / "fixed.json"
    if isinstance(doc, dict):
        path.write_text(json.dumps(doc))
    elif isinstance(doc, str):
        path.write_text(doc)
    before = dead.unchanged()
    r = dead.cli("replay", "--id", "rej-0", "--body", str(path))
    assert r.returncode == code, r.stderr
    assert r.stderr.startswith(f"onceq: {path}: ") and why in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and r.stdout == ""
    assert dead.unchanged() == before
    assert calls(dead.stub, "rej-0") == 1


def test_a_body_for_an_id_not_in_the_queue_is_refused(dead: Dead) -> None:
    fixed = dead.fixed(claim_doc("no-such-id"))
    before = dead.unchanged()
    r = dead.cli("replay", "--id", "no-such-id", "--body", str(fixed))
    assert r.returncode == 3
    assert r.stderr == (
        "onceq: claim.dead: no dead letter with message_id 'no-such-id'; nothing replayed\n"
    )
    assert dead.unchanged() == before


@pytest.mark.parametrize(
    "args",
    [["--all"], ["--reason", "http-422"], ["--id", "rej-0", "--id", "rej-1"]],
    ids=lambda a: " ".join(a),
)
def test_body_needs_exactly_one_id(dead: Dead, args: list[str]) -> None:
    fixed = dead.fixed(claim_doc("rej-0"))
    before = dead.unchanged()
    r = dead.cli("replay", *args, "--body", str(fixed))
    assert r.returncode == 2
    assert r.stderr == (
        "onceq: --body FILE replaces one message's body: give exactly one --id ID with it\n"
    )
    assert dead.unchanged() == before


def test_two_dead_letters_of_one_id_are_both_replaced_and_processed_once(dead: Dead) -> None:
    foreign_dead_letter(dead.url, "rej-1", json.dumps(rejected("rej-1")).encode())
    fixed = dead.fixed(claim_doc("rej-1"))
    r = dead.cli("replay", "--id", "rej-1", "--body", str(fixed), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["done"] == 2
    assert [b for _m, _p, b in get_all(dead.url, "claim.in")] == [fixed.read_bytes()] * 2
    consume_exercise(dead.url, dead.stub.url, dead.db)
    assert calls(dead.stub, "rej-1") == 2  # the first 422, then one 201: the twin a duplicate
    assert table(dead.db, "SELECT msg_id FROM messages") == [("rej-1",)]
    assert table(dead.db, "SELECT msg_id FROM duplicates") == [("rej-1",)]
    assert ids_in(dead.url, "claim.dead") == ["rej-0"]
