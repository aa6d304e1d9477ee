"""`onceq mq consume --queue invoice.in --url …`: a user's own flow from flags, as the
README's invoice example runs it. Every line it prints names the user's queue, never
the claims preset's claim.in. Real broker, real partner stub, real processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_mq_flow_names import declare_invoice, invoice, invoices

from mq_support import cli, partner, queues

pytestmark = pytest.mark.broker

OWN = ("--queue", "invoice.in", "--id-field", "invoiceId")


def publish_invoices(url: str, folder: Path, n: int) -> None:
    files = invoices(folder, [invoice(i) for i in range(n)])
    r = cli(url, "mq", "publish", *map(str, files), "--exchange", "invoice",
            "--routing-key", "invoice", "--id-field", "invoiceId")  # fmt: skip
    assert r.returncode == 0, r.stderr


def test_the_summary_names_the_flows_queue(amqp_url: str, tmp_path: Path) -> None:
    declare_invoice(amqp_url)
    publish_invoices(amqp_url, tmp_path / "inv", 3)
    with partner(kind="invoices") as p:
        r = cli(amqp_url, "mq", "consume", *OWN, "--url", f"{p.url}/api/invoices",
                "--until-empty", "--db", str(tmp_path / "l.db"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "3 processed" in r.stdout and "; invoice.in drained" in r.stdout, r.stdout
    assert "claim" not in r.stdout + r.stderr
    assert queues(amqp_url)["invoice.in"] == (0, 0)


def test_an_unfinished_batch_names_the_flows_queue(amqp_url: str, tmp_path: Path) -> None:
    """The deadline comes first (a partner that answers after 3 s): exit 1, and the
    line says where the rest waits — invoice.in, where it really is."""
    declare_invoice(amqp_url)
    publish_invoices(amqp_url, tmp_path / "inv", 2)
    with partner(delay=3.0, kind="invoices") as p:
        r = cli(amqp_url, "mq", "consume", *OWN, "--url", f"{p.url}/api/invoices", "--json",
                "--until-empty", "--max-seconds", "0.5",
                "--db", str(tmp_path / "l.db"))  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines()[-1] == (
        "onceq: invoice.in not drained within --max-seconds 0.5; the rest waits there"
    ), r.stderr
    assert json.loads(r.stdout)["drained"] is False
    assert "claim" not in r.stderr


def test_the_help_speaks_of_any_queue_not_only_claim_in() -> None:
    """With --queue the in-flight messages return to that queue, and --until-empty
    waits for it: the help says "the queue", and --claim takes a URL."""
    from cli_support import invoke

    r = invoke("mq", "consume", "--help")
    text = " ".join(r.stdout.split())
    assert "--claim URL" in text
    assert "the in-flight messages return to the queue" in text
    assert "return to claim.in" not in text and "once claim.in has" not in text


def test_a_queue_not_declared_yet_says_how_to_declare_it(amqp_url: str, tmp_path: Path) -> None:
    """A newcomer's first run, before `mq topology`: exit 3, one line that names the
    queue and the command that declares it; nothing created, no ledger."""
    r = cli(amqp_url, "mq", "consume", *OWN, "--url", "http://127.0.0.1:9/api/invoices",
            "--until-empty", "--db", str(tmp_path / "l.db"))  # fmt: skip
    assert r.returncode == 3, r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith("onceq: queue invoice.in: not found in vhost"), line
    assert line.endswith("; declare it first: onceq mq topology --queue invoice.in"), line
    assert not (tmp_path / "l.db").exists() and "invoice.in" not in queues(amqp_url)
