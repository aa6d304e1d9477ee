"""A flow's own RabbitMQ names: `mq topology`, `mq publish` and `mq status` with the
invoice example's queue, and --until-empty on it. Real broker, one vhost per test;
pika reads what arrived, as a client independent of onceq's."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pika
import pytest

from mq_support import broker_state, cli, get_all, queues

pytestmark = pytest.mark.broker

INVOICE_DLX = (
    ("x-dead-letter-exchange", "invoice.dlx"),
    ("x-dead-letter-routing-key", "invoice.dead"),
)
# `mq topology --queue invoice.in` declares the default retry policy's tiers too: a
# queue per delay, its TTL in ms, dead-lettering back to invoice.in by the default
# exchange.
TIER_MS = {"5s": 5_000, "30s": 30_000, "2m": 120_000, "10m": 600_000}
INVOICE_TIERS = [
    (
        f"invoice.retry.{label}",
        True,
        (
            ("x-dead-letter-exchange", ""),
            ("x-dead-letter-routing-key", "invoice.in"),
            ("x-message-ttl", ms),
        ),
    )
    for label, ms in TIER_MS.items()
]
EMPTY_TIERS = {name: (0, 0) for name, _, _ in INVOICE_TIERS}
INVOICE_STATE = {
    "exchanges": [("invoice", "direct", True), ("invoice.dlx", "direct", True)],
    "queues": sorted(
        [("invoice.dead", True, ()), ("invoice.in", True, INVOICE_DLX), *INVOICE_TIERS]
    ),
    "bindings": [
        ("invoice", "invoice.in", "invoice"),
        ("invoice.dlx", "invoice.dead", "invoice.dead"),
    ],
}
TO_INVOICE = ("--exchange", "invoice", "--routing-key", "invoice")


def invoices(folder: Path, docs: list[dict[str, Any]]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, doc in enumerate(docs):
        p = folder / f"inv{i:04d}.json"
        p.write_text(json.dumps(doc, indent=1))
        paths.append(p)
    return paths


def invoice(n: int, **extra: Any) -> dict[str, Any]:
    return {"invoiceId": f"INV-{n}", "customer": "ACME", "total": 120.5, **extra}


def declare_invoice(url: str) -> None:
    r = cli(url, "mq", "topology", "--queue", "invoice.in")
    assert r.returncode == 0, r.stderr


def test_invoice_topology_from_the_queue_name_and_a_second_run_changes_nothing(
    amqp_url: str,
) -> None:
    first = cli(amqp_url, "mq", "topology", "--queue", "invoice.in", "--json")
    assert first.returncode == 0, first.stderr
    assert broker_state(amqp_url) == INVOICE_STATE
    objects = json.loads(first.stdout)["objects"]
    assert objects["queue invoice.in"] == "created" and "queue claim.in" not in objects

    second = cli(amqp_url, "mq", "topology", "--queue", "invoice.in")
    assert second.returncode == 0 and second.stderr == "", second.stderr
    assert "0 created" in second.stdout
    assert broker_state(amqp_url) == INVOICE_STATE

    # The dead-letter arguments really route: a rejected invoice lands in invoice.dead.
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    ch.basic_publish("invoice", "invoice", b"{}")
    method, _, _ = ch.basic_get("invoice.in")
    ch.basic_reject(method.delivery_tag, requeue=False)
    conn.close()
    assert queues(amqp_url) == {"invoice.in": (0, 0), "invoice.dead": (1, 0), **EMPTY_TIERS}


def test_every_name_from_its_own_option_beside_the_claims_topology(amqp_url: str) -> None:
    # The claims preset and the billing names, as before (the exercise's policy: no
    # retry queue; the tiers have tests of their own).
    assert cli(amqp_url, "mq", "topology", "--retry", "exercise").returncode == 0
    r = cli(
        amqp_url, "mq", "topology", "--queue", "billing", "--exchange", "eai.claim",
        "--routing-key", "bill", "--dead-letter-exchange", "eai.dlx",
        "--dead-letter-queue", "billing.parked", "--retry", "exercise",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    state = broker_state(amqp_url)
    # Shared exchanges are re-declared (equal: no change), the rest added beside them.
    assert state["exchanges"] == [("eai.claim", "direct", True), ("eai.dlx", "direct", True)]
    billing_args = (
        ("x-dead-letter-exchange", "eai.dlx"),
        ("x-dead-letter-routing-key", "billing.parked"),
    )
    assert ("billing", True, billing_args) in state["queues"]
    assert ("billing.parked", True, ()) in state["queues"]
    assert len(state["queues"]) == 4
    assert ("eai.claim", "billing", "bill") in state["bindings"]
    assert ("eai.dlx", "billing.parked", "billing.parked") in state["bindings"]
    assert ("eai.claim", "claim.in", "claim") in state["bindings"]  # untouched


def test_a_conflicting_invoice_queue_exits_4_names_it_and_creates_nothing(amqp_url: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    conn.channel().queue_declare("invoice.in", durable=True)  # no dead-lettering
    conn.close()
    before = broker_state(amqp_url)
    r = cli(amqp_url, "mq", "topology", "--queue", "invoice.in")
    assert r.returncode == 4, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onceq: queue invoice.in: "), r.stderr
    assert "406" in lines[0]
    assert broker_state(amqp_url) == before  # no exchange, no invoice.dead, no binding


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--queue", "amq.invoice"), "--queue: 'amq.invoice': names starting with 'amq.'"),
        (("--queue", "q" * 256), "--queue: "),
        (("--queue", "invoice.in", "--exchange", ""), "--exchange: '': must not be empty"),
        (("--queue", "q", "--dead-letter-queue", "q"), "--dead-letter-queue: 'q': is the queue"),
    ],
)
def test_a_bad_name_exits_2_before_connecting(
    amqp_url: str, args: tuple[str, ...], words: str
) -> None:
    # A URL where nothing listens: exit 2, not 7, proves no connection was tried.
    r = cli("amqp://guest:guest@127.0.0.1:1/%2F", "mq", "topology", *args)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"onceq: {words}") and len(r.stderr.strip().splitlines()) == 1
    r = cli(amqp_url, "mq", "topology", *args)
    assert r.returncode == 2 and broker_state(amqp_url)["queues"] == []


def test_publish_invoices_with_their_own_id_exchange_and_key(amqp_url: str, tmp_path: Path) -> None:
    declare_invoice(amqp_url)
    files = invoices(tmp_path, [invoice(i) for i in range(5)])
    r = cli(amqp_url, "mq", "publish", *map(str, files), *TO_INVOICE, "--id-field", "invoiceId",
            "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"published": 5, "unroutable": [], "nacked": []}
    got = get_all(amqp_url, "invoice.in")
    assert sorted(props.message_id for _, props, _ in got) == [f"INV-{i}" for i in range(5)]
    by_id = {props.message_id: (props, body) for _, props, body in got}
    for i, f in enumerate(files):
        props, body = by_id[f"INV-{i}"]
        assert body == f.read_bytes()  # unchanged: indentation and all
        assert props.delivery_mode == 2 and props.content_type == "application/json"
        assert len(props.headers["x-onceq-copy"]) == 32  # the copy header stays
    assert queues(amqp_url)["invoice.dead"] == (0, 0)

    human = cli(amqp_url, "mq", "publish", str(files[0]), *TO_INVOICE, "--id-field", "invoiceId")
    assert human.returncode == 0, human.stderr
    assert human.stdout.strip() == "published 1 message(s) to invoice, all confirmed"


def test_a_dotted_id_field_and_the_default_exchange(amqp_url: str, tmp_path: Path) -> None:
    """--exchange "" is the broker's default exchange: routed straight to the queue named
    by the key, so no binding is needed."""
    declare_invoice(amqp_url)
    [f] = invoices(tmp_path, [{"header": {"id": "H-7"}, "total": 1}])
    r = cli(amqp_url, "mq", "publish", str(f), "--exchange", "", "--routing-key", "invoice.in",
            "--id-field", "header.id")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "the default exchange" in r.stdout
    [(_, props, _)] = get_all(amqp_url, "invoice.in")
    assert props.message_id == "H-7"


def test_a_file_without_the_id_field_exits_5_and_nothing_is_published(
    amqp_url: str, tmp_path: Path
) -> None:
    declare_invoice(amqp_url)
    good = invoices(tmp_path / "good", [invoice(1), invoice(2)])
    [bad] = invoices(tmp_path / "bad", [{"customer": "ACME", "total": 3}])
    r = cli(amqp_url, "mq", "publish", str(good[0]), str(bad), str(good[1]), *TO_INVOICE,
            "--id-field", "invoiceId")  # fmt: skip
    assert r.returncode == 5, r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert f"{bad}: no invoiceId" in line and "nothing was published" in line
    assert queues(amqp_url) == {"invoice.in": (0, 0), "invoice.dead": (0, 0), **EMPTY_TIERS}
    # The claims default would have looked for guid, which no invoice has.
    r = cli(amqp_url, "mq", "publish", str(good[0]), *TO_INVOICE)
    assert r.returncode == 5 and "no guid" in r.stderr


def test_an_unroutable_key_exits_6_naming_exchange_and_key(amqp_url: str, tmp_path: Path) -> None:
    declare_invoice(amqp_url)
    files = invoices(tmp_path, [invoice(1), invoice(2)])
    r = cli(amqp_url, "mq", "publish", *map(str, files), "--exchange", "invoice",
            "--routing-key", "invoices", "--id-field", "invoiceId")  # fmt: skip
    assert r.returncode == 6, r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "2 of 2" in line, line
    assert "unroutable (no queue bound to exchange invoice for key 'invoices')" in line
    assert queues(amqp_url) == {"invoice.in": (0, 0), "invoice.dead": (0, 0), **EMPTY_TIERS}


def test_a_missing_exchange_exits_3_naming_it(amqp_url: str, tmp_path: Path) -> None:
    files = invoices(tmp_path, [invoice(1)])
    r = cli(amqp_url, "mq", "publish", *map(str, files), *TO_INVOICE, "--id-field", "invoiceId")
    assert r.returncode == 3, r.stderr
    assert r.stderr.startswith("onceq: exchange invoice: not found")
    assert broker_state(amqp_url)["exchanges"] == []  # publish never declares


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--id-field", ""), "--id-field: '': not a field name"),
        (("--id-field", "a..b"), "--id-field: 'a..b': not a field name"),
        # the consumer's rule for a path (no blank in a key): the publisher took 'a b',
        # which the consumer's --id-field refuses, and said "no a b" (exit 5)
        (("--id-field", "a b"), "--id-field: 'a b': not a field name"),
        (("--routing-key", "k" * 256), "--routing-key: "),
    ],
)
def test_bad_publish_options_exit_2_before_reading_or_connecting(
    tmp_path: Path, args: tuple[str, ...], words: str
) -> None:
    [f] = invoices(tmp_path, [invoice(1)])
    r = cli("amqp://guest:guest@127.0.0.1:1/%2F", "mq", "publish", str(f), *args)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"onceq: {words}") and len(r.stderr.strip().splitlines()) == 1


def test_status_reads_the_flows_queues(amqp_url: str, tmp_path: Path) -> None:
    declare_invoice(amqp_url)
    files = invoices(tmp_path, [invoice(i) for i in range(3)])
    pub = cli(amqp_url, "mq", "publish", *map(str, files), *TO_INVOICE, "--id-field", "invoiceId")
    assert pub.returncode == 0, pub.stderr
    r = cli(amqp_url, "mq", "status", "--queue", "invoice.in", "--json")
    assert r.returncode == 0, r.stderr
    queues = json.loads(r.stdout)["queues"]
    # The invoice queues and nothing of the claims preset (the tiers as `mq topology
    # --queue invoice.in` names them); unacked comes from the management API, whose
    # statistics may not exist yet for queues declared a moment ago.
    assert set(queues) == {
        "invoice.in", "invoice.dead", "invoice.retry.5s", "invoice.retry.30s",
        "invoice.retry.2m", "invoice.retry.10m",
    }  # fmt: skip
    assert (queues["invoice.in"]["ready"], queues["invoice.in"]["consumers"]) == (3, 0)
    assert queues["invoice.dead"]["ready"] == 0
    r = cli(amqp_url, "mq", "status", "--queue", "invoice.in", "--dead-letter-queue", "nope",
            "--retry", "exercise", "--json")  # fmt: skip
    assert json.loads(r.stdout)["queues"].keys() == {"invoice.in", "nope"}
    assert json.loads(r.stdout)["queues"]["nope"] is None
    human = cli(amqp_url, "mq", "status", "--queue", "invoice.in")
    assert human.returncode == 0 and "invoice.dead" in human.stdout
    assert "claim.in" not in human.stdout
    # No options: the claims queues, absent in this vhost.
    r = cli(amqp_url, "mq", "status", "--retry", "exercise", "--json")
    assert json.loads(r.stdout)["queues"] == {"claim.in": None, "claim.dead": None}


def test_until_empty_drains_the_flows_own_queue(amqp_url: str, tmp_path: Path) -> None:
    """The transport's drain check asks the queue it consumes, not claim.in: with a
    claims queue holding messages beside it, the invoice batch still ends, and leaves
    claim.in alone."""
    from onceq._core.consumer import Consumer, Outcome
    from onceq._core.transport import Delivery, Kind
    from onceq._exercise import claims_0_1_0 as claim
    from onceq._ledger.sqlite import Ledger
    from onceq._sources.amqp.transport import AmqpTransport

    declare_invoice(amqp_url)
    assert cli(amqp_url, "mq", "topology").returncode == 0
    files = invoices(tmp_path, [invoice(i) for i in range(6)])
    pub = cli(amqp_url, "mq", "publish", *map(str, files), *TO_INVOICE, "--id-field", "invoiceId")
    assert pub.returncode == 0, pub.stderr
    claims = invoices(tmp_path / "c", [{"guid": "g-1", "claimId": "C", "docs": ["a"]}])
    assert cli(amqp_url, "mq", "publish", str(claims[0])).returncode == 0
    seen: list[str] = []

    async def effect(d: Delivery, fields: dict[str, Any]) -> Outcome:
        assert d.msg_id is not None
        seen.append(d.msg_id)
        return Outcome(Kind.SUCCESS, fields=fields)

    async def go() -> tuple[AmqpTransport, Any]:
        t = AmqpTransport(amqp_url, queue="invoice.in", until_empty=True)
        await t.open()
        await t.start()
        try:
            with Ledger(tmp_path / "p.db", source="amqp") as ledger:
                c = Consumer(t, ledger, claim.decode, effect, max_in_flight=5, max_group=4)
                stats = await asyncio.wait_for(c.run(), 60)
        finally:
            await t.close()
        return t, stats

    t, stats = asyncio.run(go())
    assert t.drained and stats.processed == 6
    assert sorted(seen) == [f"INV-{i}" for i in range(6)]  # message_id = invoiceId
    assert queues(amqp_url)["invoice.in"] == (0, 0)
    assert queues(amqp_url)["claim.in"] == (1, 0)


def test_the_consumer_names_the_missing_queue(amqp_url: str) -> None:
    from onceq._sources.amqp.transport import AmqpTransport
    from onceq.errors import NotFound

    async def go() -> None:
        t = AmqpTransport(amqp_url, queue="invoice.in")
        try:
            await t.open()
        finally:
            await t.close()

    with pytest.raises(NotFound, match=r"^queue invoice\.in: not found"):
        asyncio.run(go())


def test_without_options_the_claims_preset_prints_what_it_always_did(
    amqp_url: str, tmp_path: Path
) -> None:
    v = amqp_url.rsplit("/", 1)[1]
    # The exercise's policy: its six objects, word for word what it always printed.
    r = cli(amqp_url, "mq", "topology", "--retry", "exercise")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (
        f"topology ready in vhost {v!r}: 6 objects, 4 created: exchange eai.claim,"
        " exchange eai.dlx, queue claim.in, queue claim.dead"
    )
    # Without options, the default policy's retry queues besides them.
    r = cli(amqp_url, "mq", "topology")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (
        f"topology ready in vhost {v!r}: 10 objects, 4 created: queue claim.retry.5s,"
        " queue claim.retry.30s, queue claim.retry.2m, queue claim.retry.10m"
    )
    [f] = invoices(tmp_path, [{"guid": "g-1", "claimId": "C-1", "docs": ["a"]}])
    r = cli(amqp_url, "mq", "publish", str(f))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "published 1 claim(s) to eai.claim, all confirmed"
    [(_, props, _)] = get_all(amqp_url, "claim.in")
    assert props.message_id == "g-1"
