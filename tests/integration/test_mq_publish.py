"""`onceq mq publish` against the real broker: properties, validation, confirms, returns."""

from __future__ import annotations

import json
from pathlib import Path

import pika
import pytest

from mq_support import (
    CLAIMS,
    broker_state,
    claim_doc,
    cli,
    ctl,
    get_all,
    queues,
    topology,
    vhost,
    write_claims,
)

pytestmark = pytest.mark.broker


def test_each_file_becomes_one_persistent_message_with_its_exact_bytes(amqp_url: str) -> None:
    topology(amqp_url)
    files = sorted(CLAIMS.glob("*.json"))
    r = cli(amqp_url, "mq", "publish", *map(str, files), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"published": len(files), "unroutable": [], "nacked": []}

    got = get_all(amqp_url, "claim.in")
    assert len(got) == len(files)
    by_body = {body: props for _, props, body in got}
    for f in files:
        raw = f.read_bytes()
        props = by_body[raw]  # body bytes unchanged (whitespace, key order, UTF-8)
        assert props.delivery_mode == 2
        assert props.message_id == json.loads(raw)["guid"]
        assert props.content_type == "application/json"


def test_many_files_all_confirmed_over_a_small_window(amqp_url: str, tmp_path: Path) -> None:
    """More messages than the window: every one is confirmed and in the queue."""
    topology(amqp_url)
    files = write_claims(tmp_path, [claim_doc(f"g-{i}") for i in range(300)])
    r = cli(amqp_url, "mq", "publish", "--window", "16", *map(str, files), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["published"] == 300
    assert queues(amqp_url)["claim.in"] == (300, 0)


BAD_FILES = {
    # case: (file name, content or None for "does not exist" / a folder, words in the error)
    "not-json": ("notjson.json", '{"guid": "x", ', "not JSON"),
    "no-guid": ("noguid.json", json.dumps({"claimId": "C1", "docs": ["a"]}), "no guid"),
    "blank-guid": ("blank.json", json.dumps({"guid": "  ", "docs": ["a"]}), "no guid"),
    "array": ("array.json", "[1, 2]", "not a JSON object"),
    "a-folder": ("adir.json", "<dir>", "cannot read"),  # root reads 0o000 files, not folders
    "missing": ("missing.json", None, "no such file"),  # exit 3, as in every command
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_file_exits_5_and_nothing_is_published(
    amqp_url: str, tmp_path: Path, case: str
) -> None:
    topology(amqp_url)
    good = write_claims(tmp_path / "good", [claim_doc("g-1"), claim_doc("g-2")])
    name, content, why = BAD_FILES[case]
    bad = tmp_path / name
    if content == "<dir>":
        bad.mkdir()
    elif content is not None:
        bad.write_text(content)
    r = cli(amqp_url, "mq", "publish", str(good[0]), str(bad), str(good[1]))
    assert r.returncode == (3 if case == "missing" else 5), r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert str(bad) in line and why in line
    assert "nothing was published" in line
    assert queues(amqp_url)["claim.in"] == (0, 0)


def test_unroutable_exits_6(amqp_url: str, tmp_path: Path) -> None:
    topology(amqp_url)
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    conn.channel().queue_unbind("claim.in", "eai.claim", "claim")
    conn.close()
    files = write_claims(tmp_path, [claim_doc("g-1"), claim_doc("g-2")])
    r = cli(amqp_url, "mq", "publish", *map(str, files))
    assert r.returncode == 6, r.stderr
    assert "unroutable" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "2 of 2" in r.stderr
    assert queues(amqp_url) == {"claim.in": (0, 0), "claim.dead": (0, 0)}  # in no queue


def test_deleted_queue_is_unroutable_too(amqp_url: str, tmp_path: Path) -> None:
    topology(amqp_url)
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    conn.channel().queue_delete("claim.in")
    conn.close()
    before = broker_state(amqp_url)
    r = cli(amqp_url, "mq", "publish", *map(str, write_claims(tmp_path, [claim_doc("g-1")])))
    assert r.returncode == 6, r.stderr
    assert "unroutable" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    # Returned, so in no queue; and publish does not re-create the queue it lacks.
    assert queues(amqp_url) == {"claim.dead": (0, 0)}
    assert broker_state(amqp_url) == before


def test_a_nacked_message_exits_6_and_is_in_no_queue(amqp_url: str, tmp_path: Path) -> None:
    """The broker nacks what claim.in refuses (a policy: at most one message, overflow
    reject-publish): exit 6 naming the nacked count; the one accepted is the only one
    in any queue, and the nacked ones are not dead-lettered either."""
    topology(amqp_url)
    ctl(
        "set_policy", "-p", vhost(amqp_url), "--apply-to", "queues", "one-only", "^claim\\.in$",
        '{"max-length": 1, "overflow": "reject-publish"}',
    )  # fmt: skip
    files = write_claims(tmp_path, [claim_doc(f"g-{i}") for i in range(3)])
    r = cli(amqp_url, "mq", "publish", "--window", "1", *map(str, files), "--json")
    assert r.returncode == 6, r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, r.stderr
    assert "nacked" in line and "2 of 3" in line and "1 published" in line, line
    assert queues(amqp_url) == {"claim.in": (1, 0), "claim.dead": (0, 0)}
    assert [props.message_id for _, props, _ in get_all(amqp_url, "claim.in")] == ["g-0"]


def test_missing_exchange_is_not_found(amqp_url: str, tmp_path: Path) -> None:
    """No topology at all: the broker closes the channel (404); exit 3, naming eai.claim."""
    r = cli(amqp_url, "mq", "publish", *map(str, write_claims(tmp_path, [claim_doc("g-1")])))
    assert r.returncode == 3, r.stderr
    assert "eai.claim" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    # Nothing declared on the way: publish never creates topology.
    assert broker_state(amqp_url) == {"exchanges": [], "queues": [], "bindings": []}


# --- counts per file, with copies of one id among the files (issue 17) ------------------


def _no_asyncio_noise(stderr: str) -> None:
    assert "never retrieved" not in stderr and "asyncio" not in stderr, stderr
    assert "Traceback" not in stderr, stderr


def test_two_files_of_one_id_both_returned_count_as_two_returned(
    amqp_url: str, tmp_path: Path
) -> None:
    """Before: `1 of 2 … returned …; 1 published` and an asyncio error — aiormq pinned both
    returns on the last copy of the id. Each file is its own message: 2 returned, 0 out."""
    topology(amqp_url)
    files = write_claims(tmp_path, [claim_doc("same"), claim_doc("same")])
    r = cli(amqp_url, "mq", "publish", *map(str, files), "--routing-key", "nope", "--json")
    assert r.returncode == 6, r.stderr
    _no_asyncio_noise(r.stderr)
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert "2 of 2 message(s) returned as unroutable" in line and "; 0 published" in line, line
    assert json.loads(r.stdout) == {
        "published": 0,
        "unroutable": sorted(map(str, files)),
        "nacked": [],
    }
    assert queues(amqp_url) == {"claim.in": (0, 0), "claim.dead": (0, 0)}


def test_many_copies_of_few_ids_all_returned_over_a_small_window(
    amqp_url: str, tmp_path: Path
) -> None:
    topology(amqp_url)
    docs = [claim_doc(f"id-{i % 3}") for i in range(9)]  # each id three times, interleaved
    files = write_claims(tmp_path, docs)
    r = cli(amqp_url, "mq", "publish", "--window", "2", *map(str, files), "--routing-key", "nope")
    assert r.returncode == 6, r.stderr
    _no_asyncio_noise(r.stderr)
    assert "9 of 9 message(s) returned as unroutable" in r.stderr and "; 0 published" in r.stderr


def test_copies_of_one_id_are_each_published_and_counted(amqp_url: str, tmp_path: Path) -> None:
    topology(amqp_url)
    files = write_claims(tmp_path, [claim_doc("a"), claim_doc("a"), claim_doc("b")])
    r = cli(amqp_url, "mq", "publish", *map(str, files), "--json")
    assert r.returncode == 0, r.stderr
    _no_asyncio_noise(r.stderr)
    assert json.loads(r.stdout) == {"published": 3, "unroutable": [], "nacked": []}
    assert sorted(p.message_id for _, p, _ in get_all(amqp_url, "claim.in")) == ["a", "a", "b"]


def test_published_and_nacked_copies_of_shared_ids_are_counted_per_file(
    amqp_url: str, tmp_path: Path
) -> None:
    """claim.in takes two messages (overflow reject-publish nacks the rest). Files a, a, b, b:
    the first copy of each id goes out first (a copy waits for its id's previous one), so
    exactly a#1 and b#1 are published and a#2 and b#2 nacked, in the counts and the queue."""
    topology(amqp_url)
    ctl(
        "set_policy", "-p", vhost(amqp_url), "--apply-to", "queues", "two-only", "^claim\\.in$",
        '{"max-length": 2, "overflow": "reject-publish"}',
    )  # fmt: skip
    files = write_claims(tmp_path, [claim_doc("a"), claim_doc("a"), claim_doc("b"), claim_doc("b")])
    r = cli(amqp_url, "mq", "publish", *map(str, files), "--json")
    assert r.returncode == 6, r.stderr
    _no_asyncio_noise(r.stderr)
    assert "2 of 4 message(s) nacked" in r.stderr and "; 2 published" in r.stderr, r.stderr
    out = json.loads(r.stdout)
    assert out == {
        "published": 2,
        "unroutable": [],
        "nacked": sorted([str(files[1]), str(files[3])]),
    }
    assert sorted(p.message_id for _, p, _ in get_all(amqp_url, "claim.in")) == ["a", "b"]


def test_the_line_names_returns_and_nacks_apart() -> None:
    from onceq._sources.amqp.publisher import PublishReport

    report = PublishReport(published=1, unroutable=["x.json", "y.json"], nacked=["z.json"])
    line = report.problem(4, "exchange e", "k")
    assert line == (
        "2 of 4 message(s) returned as unroutable (no queue bound to exchange e for key 'k')"
        " (first: x.json), 1 nacked by the broker (exchange e, key 'k') (first: z.json);"
        " 1 published"
    )
    assert PublishReport(published=3).problem(3, "exchange e", "k") == ""
