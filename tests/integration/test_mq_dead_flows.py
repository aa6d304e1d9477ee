"""`onceq mq dead` on a user's own flow: --queue Q (+ --id-field) or --flows FILE --flow
NAME; the ledger's rows are read and written under that flow only. Also: header values
are never shown, and a broker that cannot be reached is exit 7 with nothing changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mq_dead_support import foreign_dead_letter, ids_in, ledger_dump, run_dead, table
from mq_support import cli, partner, topology

pytestmark = pytest.mark.broker

FLOWS = """\
ledger = "ledger.db"

[flows.invoices]
source = "rabbitmq"
queue = "invoice.in"
id_field = "invoiceId"

[flows.payments]
source = "rabbitmq"
queue = "pay"
exchange = "money"
dead_letter_queue = "pay.graveyard"

[flows.files]
source = "dirq"
path = "q"
"""


def _invoices_dead(url: str, tmp: Path) -> Path:
    """Two invoices the partner refuses (422) dead in invoice.dead under flow `invoices`,
    and one put there by hand without a message_id property (its id in the body)."""
    (tmp / "flows.toml").write_text(FLOWS)
    r = cli(url, "mq", "topology", "--flows", str(tmp / "flows.toml"))
    assert r.returncode == 0, r.stderr
    files = []
    for i in range(2):
        p = tmp / f"inv-{i}.json"
        p.write_text(json.dumps({"invoiceId": f"INV-{i}", "customer": "ACME"}))  # no total
        files.append(str(p))
    r = cli(url, "mq", "publish", *files, "--exchange", "invoice", "--routing-key", "invoice",
            "--id-field", "invoiceId")  # fmt: skip
    assert r.returncode == 0, r.stderr
    db = tmp / "ledger.db"
    with partner(kind="invoices") as stub:
        r = cli(url, "mq", "consume", "--queue", "invoice.in", "--id-field", "invoiceId",
                "--url", f"{stub.url}/api/invoices", "--flow", "invoices", "--db", str(db),
                "--until-empty")  # fmt: skip
        assert r.returncode == 11, r.stderr  # both refused: every message failed
    body = json.dumps({"invoiceId": "INV-HAND", "total": 1}).encode()
    foreign_dead_letter(url, None, body, exchange="invoice.dlx", key="invoice.dead")
    assert sorted(ids_in(url, "invoice.dead"), key=str) == sorted(["INV-0", "INV-1", None], key=str)
    return db


def test_own_flow_by_flow_file_and_by_queue(amqp_url: str, tmp_path: Path) -> None:
    db = _invoices_dead(amqp_url, tmp_path)
    flows = ["--flows", str(tmp_path / "flows.toml"), "--flow", "invoices"]

    def listed(*args: str) -> dict[str, str]:
        r = run_dead(amqp_url, "list", *args, "--json", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        return {x["message_id"]: x["reason"] for x in json.loads(r.stdout)["letters"]}

    want = {"INV-0": "http-422", "INV-1": "http-422", "INV-HAND": "unknown"}
    assert listed(*flows) == want  # the flow file's queue, id rule and ledger
    by_queue = ["--queue", "invoice.in", "--id-field", "invoiceId", "--db", str(db)]
    assert listed(*by_queue, "--flow", "invoices") == want
    # Another flow's scope in the same ledger knows none of them.
    assert listed(*by_queue) == dict.fromkeys(want, "unknown")
    # Without --id-field the hand-made one has no id (no property, no msg_id field).
    assert listed("--queue", "invoice.in", "--db", str(db), "--flow", "invoices") == {
        "INV-0": "http-422", "INV-1": "http-422", None: "unknown"
    }  # fmt: skip

    r = run_dead(amqp_url, "replay", "--reason", "http-422", *flows, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["done"], doc["exchange"], doc["routing_key"]) == (2, "invoice", "invoice")
    assert sorted(ids_in(amqp_url, "invoice.in")) == ["INV-0", "INV-1"]
    assert ids_in(amqp_url, "invoice.dead") == [None]
    ops = table(db, "SELECT flow, op, queue, count FROM dead_ops")
    assert ops == [("invoices", "replay", "invoice.dead", 2)]


def test_flow_file_mistakes_are_refused(amqp_url: str, tmp_path: Path) -> None:
    (tmp_path / "flows.toml").write_text(FLOWS)
    flows = str(tmp_path / "flows.toml")
    for args, words in [
        (("--flows", flows), "2 rabbitmq flows: name one with --flow NAME"),
        (("--flows", flows, "--flow", "files"), "'files' is not a rabbitmq flow"),
        (("--flows", flows, "--flow", "invoices", "--queue", "x"), "give no --queue"),
        (("--flows", flows, "--flow", "nope"), "--flow: 'nope': no such flow"),
    ]:
        r = run_dead(amqp_url, "list", *args, cwd=tmp_path)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.startswith("onceq: ") and words in r.stderr, (args, r.stderr)
        assert not (tmp_path / "ledger.db").exists()


def test_header_values_are_never_shown(amqp_url: str, tmp_path: Path) -> None:
    topology(amqp_url)
    db = tmp_path / "processed.db"
    from onceq._ledger.sqlite import Ledger

    Ledger(db, "amqp").close()  # the consumer's ledger, empty
    secret = "Bearer s3cret-t0ken-value"
    foreign_dead_letter(amqp_url, "g-1", headers={"authorization": secret, "x-tenant": "t-99"})
    for args in ((), ("--json",)):
        r = run_dead(amqp_url, "list", "--db", str(db), *args)
        assert r.returncode == 0, r.stderr
        assert "g-1" in r.stdout
        assert "s3cret" not in r.stdout + r.stderr and "t-99" not in r.stdout + r.stderr


def test_an_unreachable_broker_is_exit_7_and_changes_nothing(tmp_path: Path) -> None:
    from onceq._ledger.sqlite import Ledger

    db = tmp_path / "processed.db"
    Ledger(db, "amqp").close()
    before = ledger_dump(db)
    from support import free_port

    url = f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F"
    for args in (("list",), ("replay", "--all"), ("purge", "--all", "--yes")):
        r = run_dead(url, *args, "--db", str(db))
        assert r.returncode == 7, (args, r.stderr)
        assert r.stderr.startswith("onceq: ") and r.stderr.count("\n") == 1, r.stderr
        assert "guest:guest" not in r.stderr
    assert ledger_dump(db) == before
