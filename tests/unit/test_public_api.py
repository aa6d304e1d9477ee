"""The public Python API: exactly the names of `onceq.__all__`, each usable as documented.

The list is fixed here on purpose: a name that appears or disappears is an API change,
and it should fail a test so that whoever makes it also updates docs/api.md. A user's
flow is tested the way docs/api.md tells users to test theirs: with the public
MemoryTransport, no broker and no partner.
"""

from __future__ import annotations

import importlib.resources
import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import onceq

PUBLIC = [
    # a flow and how it runs
    "Flow",
    "DirSource",
    "RabbitSource",
    "NatsSource",
    "MessageSpec",
    "HttpEffect",
    "StatusMap",
    "PythonEffect",
    "SqlEffect",
    "Reject",
    "Retry",
    "RetryPolicy",
    "BreakerPolicy",
    "GuardPolicy",
    "run",
    "run_async",
    "load_flows",
    # testing a flow, and the loop underneath
    "MemoryTransport",
    "Consumer",
    "Outcome",
    "Stats",
    "Ledger",
    "Delivery",
    "Kind",
    "Settle",
    "decide",
    # errors (exit codes: onceq.errors.EXIT_CODES)
    "OnceqError",
    "UsageError",
    "NotFound",
    "Conflict",
    "BadMessage",
    "Unroutable",
    "BrokerUnavailable",
    "LedgerError",
    "QueueError",
    "Misconfigured",
    "AllFailed",
    "__version__",
]


def test_all_is_exactly_the_public_list() -> None:
    assert sorted(onceq.__all__) == sorted(PUBLIC)
    # Every lazily imported name is public, and every public name is importable.
    assert set(onceq._LAZY) <= set(PUBLIC)
    assert len(onceq.__all__) == len(set(onceq.__all__)), "a name is listed twice"


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_resolves_and_is_listed_by_dir(name: str) -> None:
    value = getattr(onceq, name)
    assert value is not None
    assert name in dir(onceq)
    if name != "__version__":
        # Defined where its module says, not a copy: `onceq.X is onceq.module.X`.
        module = sys.modules[getattr(value, "__module__", "onceq")]
        assert getattr(module, name) is value


def test_the_error_classes_are_errors_of_the_tree_with_their_exit_codes() -> None:
    from onceq.errors import EXIT_CODES

    for name, code in EXIT_CODES.items():
        cls = getattr(onceq, name)
        assert issubclass(cls, onceq.OnceqError) and cls.exit_code == code


def test_every_module_outside_the_public_api_is_private() -> None:
    """`import onceq` (its `__all__`) and `onceq.errors` are the API; every other module
    sits in a package whose name starts with an underscore, so an import of it says it
    reaches into internals that may change without notice."""
    src = Path(onceq.__file__).parent
    public = {"__init__.py", "__main__.py", "errors.py"}
    for path in src.rglob("*.py"):
        rel = path.relative_to(src)
        if len(rel.parts) == 1:
            assert rel.name in public, f"{rel}: a public top-level module outside the API"
        else:
            assert rel.parts[0].startswith("_"), f"{rel}: a module in a public package"
    assert all(home.split(".")[1].startswith("_") for home in onceq._LAZY.values())


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        onceq.Nope  # noqa: B018


def test_importing_onceq_loads_neither_asyncio_nor_sqlite3() -> None:
    """`onceq --help` and `dirq lag` start fast: the public names are imported lazily."""
    code = (
        "import sys, onceq; dir(onceq); "
        "print([m for m in ('asyncio', 'sqlite3', 'aiohttp') if m in sys.modules])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


def test_py_typed_ships_with_the_package() -> None:
    """PEP 561: without the marker a type checker ignores onceq's annotations."""
    marker = importlib.resources.files("onceq").joinpath("py.typed")
    assert marker.is_file()


# --- a user's flow, tested with the public in-memory transport -----------------------

INVOICES_DDL = (
    "CREATE TABLE IF NOT EXISTS invoices (id TEXT PRIMARY KEY, customer TEXT, total REAL)"
)
calls: list[str] = []


def check_invoice(invoice: dict[str, Any]) -> None:
    """A user's call effect: the partner call would be here."""
    calls.append(invoice["invoiceId"])
    if invoice["total"] < 0:
        raise onceq.Reject("negative total")
    if invoice["customer"].startswith("BUSY"):
        raise onceq.Retry("customer busy")


def save_invoice(tx: sqlite3.Connection, invoice: dict[str, Any]) -> None:
    """A user's SQL effect: a business row in the ledger's own transaction."""
    tx.execute(
        "INSERT INTO invoices VALUES (?, ?, ?)",
        (invoice["invoiceId"], invoice["customer"], invoice["total"]),
    )


def test_a_users_flow_runs_on_the_memory_transport_without_a_broker(tmp_path: Path) -> None:
    calls.clear()
    transport = onceq.MemoryTransport()
    for doc in (
        {"invoiceId": "INV-1", "customer": "ACME", "total": 120.5},
        {"invoiceId": "INV-2", "customer": "Globex", "total": 80},
        {"invoiceId": "INV-1", "customer": "ACME", "total": 120.5},  # a re-sent copy
        {"invoiceId": "INV-5", "customer": "Umbrella", "total": -5},
        {"invoiceId": "INV-6", "customer": "BUSY Corp", "total": 10},
        {"customer": "Nobody", "total": 1},
    ):
        transport.publish(json.dumps(doc).encode())
    transport.publish(b"not json")
    flow = onceq.Flow(
        "invoices",
        transport,
        onceq.MessageSpec(id_field="invoiceId", required=("customer", "total"), keep=("total",)),
        effect=check_invoice,
        sql=onceq.SqlEffect(save_invoice, setup=INVOICES_DDL),
        retry=onceq.RetryPolicy.exercise(),  # one immediate retry, then dead: no waiting
    )
    ledger = tmp_path / "ledger.db"

    stats = onceq.run(flow, ledger=ledger, until_empty=True)

    s = stats["invoices"]
    assert isinstance(s, onceq.Stats)
    assert (s.processed, s.duplicates, s.dead, s.requeued) == (2, 1, 4, 1), s
    assert dict(s.reasons) == {"rejected": 1, "retry": 1, "missing-field": 1, "parse": 1}
    # The BUSY invoice was retried once (the exercise's rule: 2 attempts), the re-sent copy
    # never reached the function; the refused messages are in the transport's dead list.
    assert sorted(calls) == ["INV-1", "INV-2", "INV-5", "INV-6", "INV-6"]
    assert sorted(reason for _, reason in transport.dead) == [
        "missing-field",
        "parse",
        "rejected",
        "retry",
    ]
    with sqlite3.connect(ledger) as db:
        assert db.execute("SELECT id FROM invoices ORDER BY id").fetchall() == [
            ("INV-1",),
            ("INV-2",),
        ]
        kept = db.execute(
            "SELECT msg_id, json_extract(kept, '$.total') FROM messages"
            " WHERE flow = 'invoices' ORDER BY msg_id"
        ).fetchall()
    assert kept == [("INV-1", 120.5), ("INV-2", 80)]

    # Run again on the same ledger: the ids it holds are duplicates, nothing is applied twice.
    again = onceq.MemoryTransport()
    again.publish(json.dumps({"invoiceId": "INV-2", "customer": "Globex", "total": 80}).encode())
    flow.source = again
    s2 = onceq.run(flow, ledger=ledger, until_empty=True)["invoices"]
    assert (s2.processed, s2.duplicates) == (0, 1)
    with sqlite3.connect(ledger) as db:
        assert db.execute("SELECT count(*) FROM invoices").fetchone() == (2,)


def test_a_flow_that_cannot_run_is_refused_with_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(onceq.UsageError, match="flow name"):
        onceq.run(onceq.Flow("no spaces", onceq.MemoryTransport()), ledger=tmp_path / "l.db")
    assert not (tmp_path / "l.db").exists()


# --- retries and the breaker, through onceq.run --------------------------------------


def _doc(msg_id: str) -> bytes:
    return json.dumps({"msg_id": msg_id}).encode()


def test_a_flows_retry_policy_gives_a_flaky_partner_its_delayed_tries(tmp_path: Path) -> None:
    """Two transient failures, then success: one immediate retry, then the 50 ms tier,
    each failure recorded durably (requeue, then delay) and the message done once."""
    tries: list[str] = []

    def flaky(doc: dict[str, Any]) -> None:
        tries.append(doc["msg_id"])
        if len(tries) < 3:
            raise onceq.Retry("partner warming up")

    queue = onceq.MemoryTransport()
    queue.publish(_doc("m1"))
    policy = onceq.RetryPolicy(immediate=1, delays=("50ms", "1s"))
    flow = onceq.Flow("f", queue, effect=flaky, retry=policy, breaker=onceq.BreakerPolicy.off())
    s = onceq.run(flow, ledger=tmp_path / "l.db", until_empty=True)["f"]
    assert (s.processed, s.requeued, s.dead, tries) == (1, 2, 0, ["m1"] * 3)
    assert [delay for _, delay in queue.delayed] == [0.05]
    with sqlite3.connect(tmp_path / "l.db") as db:
        rows = db.execute("SELECT attempt, action, delay_s FROM failures ORDER BY id").fetchall()
    assert rows == [(1, "requeue", None), (2, "delay", 0.05)]


def test_a_flow_without_a_policy_runs_the_default_tiers(tmp_path: Path) -> None:
    """No retry given: 1 immediate retry, then the first tier (5 s) — seen in the ledger
    and the transport before it comes back; the run is stopped by max_seconds."""

    def down(doc: dict[str, Any]) -> None:
        raise onceq.Retry("partner down")

    queue = onceq.MemoryTransport()
    queue.publish(_doc("m1"))
    flow = onceq.Flow("f", queue, effect=down)
    s = onceq.run(flow, ledger=tmp_path / "l.db", max_seconds=1.0)["f"]
    assert (s.processed, s.requeued, s.dead) == (0, 2, 0)
    assert [delay for _, delay in queue.delayed] == [5.0]
    assert flow.retry_policy() == onceq.RetryPolicy() and onceq.RetryPolicy().delays[0] == 5.0
    assert flow.breaker_policy() == onceq.BreakerPolicy()  # a call effect: the breaker on
