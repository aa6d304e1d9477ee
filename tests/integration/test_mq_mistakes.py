"""A user's mistakes with the mq commands: one line `onceq: …`, its own exit code, no
traceback, no password, and no state left behind (no ledger file, nothing consumed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mq_support import EXERCISE, claim_doc, cli, publish, queues, topology, write_claims

SECRET = "s3cretPassw0rd"


def _one_line(r: object, code: int) -> str:
    out = r.stdout + r.stderr  # type: ignore[attr-defined]
    assert r.returncode == code, out  # type: ignore[attr-defined]
    assert "Traceback" not in out and SECRET not in out
    lines = r.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith("onceq: "), lines
    return lines[0]


@pytest.mark.parametrize(
    ("url", "words"),
    [
        (f"amqp://guest:{SECRET}@127.0.0.1:notaport/v", "not a valid URL"),
        (f"amqp://guest:{SECRET}@127.0.0.1:99999/v", "Port out of range"),
        (f"amqp://guest:{SECRET}@[::1:5672/v", "Invalid IPv6 URL"),
        (f"amqp://guest:{SECRET}@127.0.0.1:0/v", "port 0"),
        (f"http://guest:{SECRET}@127.0.0.1:5672/v", "not an amqp://"),
    ],
)
def test_a_malformed_broker_url_is_a_usage_error(tmp_path: Path, url: str, words: str) -> None:
    claim = write_claims(tmp_path / "c", [claim_doc("g-1")])[0]
    db = tmp_path / "sub" / "ledger.db"
    for args in (
        ("mq", "topology"),
        ("mq", "publish", str(claim)),
        ("mq", "status"),
        ("mq", "consume", "--claim", "http://127.0.0.1:9", "--db", str(db)),
    ):
        line = _one_line(cli(url, *args), 2)
        assert "EAI_AMQP_URL" in line and words in line, line
    assert not db.parent.exists()


@pytest.mark.parametrize(
    ("claim", "words"),
    [
        (f"http://u:{SECRET}@[::1", "Invalid IPv6 URL"),
        (f"http://u:{SECRET}@127.0.0.1:99999", "Port out of range"),
        ("http://127.0.0.1:0", "port 0"),
        ("ftp://127.0.0.1/claims", "not an http://"),
        ("127.0.0.1:9202", "not an http://"),
    ],
)
def test_an_unusable_claim_url_consumes_nothing(
    amqp_url: str, tmp_path: Path, claim: str, words: str
) -> None:
    """Refused before connecting: a typo in the port must not dead-letter the queue."""
    topology(amqp_url)
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc("g-1")]))
    db = tmp_path / "ledger.db"
    r = cli(amqp_url, "mq", "consume", "--claim", claim, "--db", str(db), "--max-seconds", "1")
    line = _one_line(r, 2)
    assert "--claim" in line and words in line, line
    assert queues(amqp_url) == {"claim.in": (1, 0), "claim.dead": (0, 0)}
    assert not db.exists()


@pytest.mark.parametrize(
    "args",
    [
        ("--max-seconds", "nan"),
        ("--max-seconds", "inf"),
        ("--max-seconds", "1e400"),
        ("--timeout", "nan"),
        ("--max-seconds", "0"),
        ("--prefetch", "0"),
    ],
)
def test_a_nonsense_number_is_a_usage_error(tmp_path: Path, args: tuple[str, str]) -> None:
    """nan made the consumer stop at once and exit 0; inf never stopped."""
    db = tmp_path / "ledger.db"
    r = cli(
        "amqp://guest:guest@127.0.0.1:5672/%2F",
        "mq", "consume", "--claim", "http://127.0.0.1:9", "--db", str(db), *args,
    )  # fmt: skip
    line = _one_line(r, 2)
    assert args[0] in line
    assert not db.exists()


def test_partner_delay_must_be_finite() -> None:
    r = cli("amqp://x", "partner", "claim", "--port", "0", "--delay", "nan")
    assert "--delay" in _one_line(r, 2)


def test_missing_vhost_names_it_in_plain_words(amqp_url: str, tmp_path: Path) -> None:
    """Not aiormq's 'Expected Connection.OpenOk, got <Connection.Close object at 0x…>'."""
    gone = amqp_url + "-gone"
    db = tmp_path / "sub" / "ledger.db"
    for args in (
        ("mq", "topology"),
        ("mq", "consume", "--claim", "http://127.0.0.1:9", "--db", str(db)),
    ):
        line = _one_line(cli(gone, *args), 7)
        assert "vhost" in line and "-gone' does not exist" in line, line
        assert "object at 0x" not in line
    assert not db.parent.exists()


def test_a_refused_consume_leaves_no_ledger_file(amqp_url: str, tmp_path: Path) -> None:
    """No claim.in yet (consumer started before `onceq mq topology`): exit 3, no db."""
    db = tmp_path / "sub" / "ledger.db"
    r = cli(amqp_url, "mq", "consume", "--claim", "http://127.0.0.1:9", "--db", str(db))
    assert "claim.in" in _one_line(r, 3)
    assert not db.parent.exists()
    r = cli(
        f"amqp://guest:{SECRET}@127.0.0.1:1/v",
        "mq", "consume", "--claim", "http://127.0.0.1:9", "--db", str(db),
    )  # fmt: skip
    _one_line(r, 7)
    assert not db.parent.exists()


def test_a_ledger_that_cannot_be_opened_consumes_nothing(amqp_url: str, tmp_path: Path) -> None:
    topology(amqp_url)
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc("g-1")]))
    not_a_db = tmp_path / "c" / "c00000.json"  # a claim file, not a database
    r = cli(amqp_url, "mq", "consume", "--claim", "http://127.0.0.1:9", "--db", str(not_a_db),
            *EXERCISE)  # fmt: skip
    assert str(not_a_db) in _one_line(r, 8)
    # Nothing was taken: the message is ready again, not redelivered to a dead letter.
    assert queues(amqp_url) == {"claim.in": (1, 0), "claim.dead": (0, 0)}


def test_publish_of_an_oversized_file_is_refused_before_anything_is_sent(
    amqp_url: str, tmp_path: Path
) -> None:
    """Over RabbitMQ's default max_message_size (128 MiB): a bad file (5), not a '406
    conflict on exchange eai.claim' (4), and refused from its size, without reading it."""
    topology(amqp_url)
    good = write_claims(tmp_path / "c", [claim_doc("g-1")])[0]
    big = tmp_path / "big.json"
    with big.open("wb") as f:  # sparse: no 128 MiB written to the disk
        f.truncate(128 * 2**20 + 1)
    r = cli(amqp_url, "mq", "publish", str(good), str(big))
    line = _one_line(r, 5)
    assert str(big) in line and "too large" in line and "nothing was published" in line
    assert queues(amqp_url)["claim.in"] == (0, 0)
