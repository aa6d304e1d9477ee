"""The misconfiguration guard and the all-failed exit over RabbitMQ: a real broker (a
vhost of its own), the invoice partner stub, `onceq mq consume` as a process.

A typo'd URL path answers 404 on every call: the run stops after the first 10
verdicts plus the calls already under way (prefetch 5: at most 4 more), those are
dead-lettered, every other message is still ready in invoice.in (the prefetched but
undecided ones given back untried), exit 10. A small batch that only fails exits 11
with --until-empty; a mixed one 0; the claims preset keeps the exercise's rule.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_mq_flow_names import declare_invoice, invoice, invoices

from mq_support import claim_doc, cli, consume, partner, publish, queues, topology, write_claims

pytestmark = pytest.mark.broker

OWN = ("--queue", "invoice.in", "--id-field", "invoiceId", "--until-empty")


def publish_invoices(url: str, folder: Path, docs: list[dict[str, object]]) -> None:
    files = invoices(folder, docs)
    r = cli(url, "mq", "publish", *map(str, files), "--exchange", "invoice",
            "--routing-key", "invoice", "--id-field", "invoiceId")  # fmt: skip
    assert r.returncode == 0, r.stderr


def dead_queue(url: str) -> str:
    (name,) = [q for q in queues(url) if q.startswith("invoice.") and q.endswith("dead")]
    return name


def test_a_404_url_stops_after_the_first_ten_of_a_thousand(amqp_url: str, tmp_path: Path) -> None:
    declare_invoice(amqp_url)
    publish_invoices(amqp_url, tmp_path / "inv", [invoice(i) for i in range(1000)])
    with partner(kind="invoices", keys=False) as p:
        url = p.url.replace("http://", "http://svc:s3cretpw@") + "/wrong-path"
        r = cli(amqp_url, "mq", "consume", *OWN, "--url", url, "--prefetch", "5",
                "--db", str(tmp_path / "l.db"))  # fmt: skip
    assert r.returncode == 10, r.stderr
    state = queues(amqp_url)
    dead = state[dead_queue(amqp_url)][0]
    ready, unacked = state["invoice.in"]
    assert 10 <= dead <= 10 + 4, state
    assert (ready + dead, unacked) == (1000, 0), state
    line = r.stderr.splitlines()[-1]
    assert line.startswith("onceq: invoice.in: misconfigured? the first 10 message(s) all"), line
    assert "svc:***@127.0.0.1" in line and "/wrong-path answers 404 Not Found" in line, line
    assert "s3cretpw" not in r.stderr + r.stdout
    assert f"{dead} dead (http-404 {dead})" in r.stdout


def test_a_small_batch_that_only_fails_exits_11_and_a_mixed_one_0(
    amqp_url: str, tmp_path: Path
) -> None:
    declare_invoice(amqp_url)
    publish_invoices(amqp_url, tmp_path / "a", [invoice(i) for i in range(3)])
    with partner(kind="invoices", keys=False) as p:
        r = cli(amqp_url, "mq", "consume", *OWN, "--url", f"{p.url}/wrong-path", "--json",
                "--db", str(tmp_path / "l.db"))  # fmt: skip
        assert r.returncode == 11, r.stderr
        assert r.stderr.splitlines()[-1] == (
            "onceq: invoice.in: every message failed: 3 dead (http-404 3)"
        )
        assert json.loads(r.stdout)["all_failed"] is True
        # The same all-failed batch with --no-guard past the threshold: 11, all dead.
        publish_invoices(amqp_url, tmp_path / "b", [invoice(i) for i in range(10, 30)])
        r = cli(amqp_url, "mq", "consume", *OWN, "--url", f"{p.url}/wrong-path", "--no-guard",
                "--db", str(tmp_path / "l.db"))  # fmt: skip
        assert r.returncode == 11, r.stderr
        assert queues(amqp_url)[dead_queue(amqp_url)][0] == 23
        # Mixed: the partner's route, one invoice it rejects among good ones: 0.
        publish_invoices(amqp_url, tmp_path / "c", [invoice(i) for i in range(40, 45)])
        r = cli(amqp_url, "mq", "consume", *OWN, "--url", f"{p.url}/api/invoices",
                "--db", str(tmp_path / "l.db"))  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert "5 processed" in r.stdout
    assert queues(amqp_url)["invoice.in"] == (0, 0)


def test_the_claims_preset_dead_letters_every_rejected_claim_and_exits_0(
    amqp_url: str, tmp_path: Path
) -> None:
    """Seed 001's rule: a 422 is dead-lettered and the run goes on; a batch of nothing
    but 422s (past the guard's threshold) still ends 0 under --claim."""
    topology(amqp_url)
    docs = [claim_doc(f"g-{i}", docs=[]) for i in range(15)]  # no documents: 422
    publish(amqp_url, *write_claims(tmp_path / "claims", docs))
    with partner() as p:
        r = consume(amqp_url, p.url, tmp_path / "l.db", "--until-empty")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["dead"], out["all_failed"]) == (15, True) and "misconfigured" not in out
    assert queues(amqp_url)["claim.dead"][0] == 15


def test_a_service_stops_itself_too(amqp_url: str, tmp_path: Path) -> None:
    """Without --until-empty (a consumer that runs until stopped) the guard ends it
    all the same, long before --max-seconds: exit 10, the rest ready in the queue."""
    declare_invoice(amqp_url)
    publish_invoices(amqp_url, tmp_path / "inv", [invoice(i) for i in range(100)])
    with partner(kind="invoices", keys=False) as p:
        r = cli(amqp_url, "mq", "consume", "--queue", "invoice.in", "--id-field", "invoiceId",
                "--url", f"{p.url}/wrong-path", "--max-seconds", "120", "--json",
                "--db", str(tmp_path / "l.db"))  # fmt: skip
    assert r.returncode == 10, r.stderr
    out = json.loads(r.stdout)
    assert "/wrong-path answers 404" in out["misconfigured"] and 10 <= out["dead"] <= 14
    assert queues(amqp_url)["invoice.in"] == (100 - out["dead"], 0)
