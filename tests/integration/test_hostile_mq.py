"""Hostile claims on the real broker: `mq publish` refuses them, `mq consume` dead-letters them.

Before: a 5,000-digit number crashed `mq consume` (the message was redelivered to
every new consumer: a poison loop); a message_id that is not UTF-8 dropped the
connection on every redelivery; `mq publish` ended in a traceback half-way through a
batch for a guid with a lone surrogate or longer than an AMQP shortstr.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import pika
import pytest

from mq_support import (
    claim_doc,
    cli,
    get_all,
    partner,
    queues,
    rows,
    start_consumer,
    topology,
    wait_for,
    write_claims,
)

pytestmark = pytest.mark.broker

HUGE = "9" * 5000

# case: (file content, words in the one-line refusal)
HOSTILE_FILES = {
    "huge-number": ('{"guid": "g-x", "amount": ' + HUGE + "}", "4300 digits"),
    "surrogate-guid": ('{"guid": "s\\ud800x", "docs": ["a"]}', "lone surrogate"),
    "long-guid": (json.dumps({"guid": "x" * 256}), "256 bytes"),
    "long-utf8-guid": (json.dumps({"guid": "\u00e9" * 128}), "256 bytes"),
    "huge-int-guid": ('{"guid": ' + "7" * 300 + "}", "300 bytes"),
    "newline-guid": (json.dumps({"guid": "a\r\nX-Evil: 1"}), "control character"),
    "deep": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_FILES))
def test_publish_refuses_a_hostile_file_in_one_line_and_publishes_nothing(
    amqp_url: str, tmp_path: Path, case: str
) -> None:
    topology(amqp_url)
    good = write_claims(tmp_path / "good", [claim_doc("g-1"), claim_doc("g-2")])
    content, why = HOSTILE_FILES[case]
    bad = tmp_path / f"{case}.json"
    bad.write_text(content)
    r = cli(amqp_url, "mq", "publish", str(good[0]), str(bad), str(good[1]))
    assert r.returncode == 5, r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert line.startswith(f"onceq: {bad}: ") and why in line, line
    assert "nothing was published" in line
    assert queues(amqp_url)["claim.in"] == (0, 0)


def test_a_guid_of_exactly_255_bytes_is_published(amqp_url: str, tmp_path: Path) -> None:
    """The limit is the shortstr's, not lower: 255 bytes (here 85 three-byte characters)."""
    topology(amqp_url)
    guid = "\u20ac" * 85
    files = write_claims(tmp_path, [claim_doc(guid)])
    r = cli(amqp_url, "mq", "publish", str(files[0]))
    assert r.returncode == 0, r.stderr
    [(_, props, _)] = get_all(amqp_url, "claim.in")
    assert props.message_id == guid


def _body(doc: dict) -> bytes:
    return json.dumps(doc).encode()


# (message_id property or None, body, reason it is dead-lettered with)
HOSTILE_MESSAGES: list[tuple[str | bytes | None, bytes, str]] = [
    ("h-huge", b'{"guid": "h-huge", "amount": ' + HUGE.encode() + b"}", "parse"),
    ("h-deep", b"[" * 100_000 + b"]" * 100_000, "parse"),
    ("h-latin1", '{"guid": "caf\u00e9"}'.encode("latin-1"), "parse"),
    ("h-list", b"[1, 2]", "not-object"),
    (b"\xff\xfe", _body(claim_doc("h-bad-prop")), "encoding"),  # not UTF-8 on the wire
    (None, b'{"guid": "s\\ud800x", "docs": ["a"]}', "encoding"),
    (None, b'{"claimId": "C-none", "docs": ["a"]}', "missing-id"),
    ("", b'{"guid": ["a"], "docs": ["a"]}', "bad-id"),
    (None, _body({**claim_doc("x"), "guid": "a\r\nX-Evil: 1"}), "bad-id"),
    ("h-claim", b'{"guid": "h-claim", "claimId": "\\udfff", "docs": ["a"]}', "encoding"),
]
GOOD = [
    ("g-1", _body(claim_doc("g-1"))),
    (None, _body(claim_doc("g-2"))),  # no property: the guid is the id
    ("g-3", b'{"guid": "g-3", "claimId": "C-3", "amount": 18446744073709551616, "docs": ["a"]}'),
]


def _publish_raw(url: str, messages: list[tuple[str | bytes | None, bytes]]) -> None:
    """pika, not `mq publish`: a hostile producer is not bound by our publisher's checks."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for msg_id, body in messages:
            props = pika.BasicProperties(delivery_mode=2, message_id=msg_id)
            ch.basic_publish("eai.claim", "claim", body, props, mandatory=True)
    finally:
        conn.close()


def test_consume_dead_letters_each_hostile_message_and_processes_the_rest(
    amqp_url: str, tmp_path: Path
) -> None:
    topology(amqp_url)
    hostile = [(m, b) for m, b, _ in HOSTILE_MESSAGES]
    # Good messages before, between and after the hostile ones.
    _publish_raw(amqp_url, [GOOD[0], *hostile[:5], GOOD[1], *hostile[5:], GOOD[2]])
    db = tmp_path / "processed.db"
    with partner() as p:
        proc = start_consumer(amqp_url, p.url, db, "--prefetch", "4")
        try:
            # Done by construction: claim.in empty, every hostile one in claim.dead.
            wait_for(
                lambda: queues(amqp_url) == {"claim.in": (0, 0), "claim.dead": (10, 0)},
                timeout=60,
            )
            wait_for(lambda: len(rows(db, "SELECT 1 FROM processed")) == 3, timeout=30)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
        stats = p.stats()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "InvalidFrameError" not in err and "lost" not in err
    summary = json.loads(out)
    assert (summary["received"], summary["processed"], summary["dead"]) == (13, 3, 10)

    assert {r[0] for r in rows(db, "SELECT msg_id FROM processed")} == {"g-1", "g-2", "g-3"}
    assert rows(db, "SELECT amount FROM processed WHERE msg_id = 'g-3'") == [(None,)]
    reasons = Counter(r[0] for r in rows(db, "SELECT reason FROM failures WHERE action='dead'"))
    assert reasons == Counter(reason for _, _, reason in HOSTILE_MESSAGES)
    # The claim system saw the good ones once each, and never a hostile one.
    assert stats["by_guid"] == {"g-1": 1, "g-2": 1, "g-3": 1}
    dead_bodies = sorted(body for _, _, body in get_all(amqp_url, "claim.dead"))
    assert dead_bodies == sorted(b for _, b in hostile)
