"""The done-when of retention: `onceq ledger prune` runs while a consumer runs, on SQLite
and on PostgreSQL, and the consumer neither fails nor applies again a message that is
still inside the window.

A real `onceq run` (a directory-queue flow that POSTs each invoice to the invoice
partner stub, running until SIGTERM) has consumed recent invoices; the ledger also
holds many rows 40 days old. `onceq ledger prune --older-than 30d` removes those in
small batches while re-sent copies of the recent invoices, and new invoices, are
dropped into the queue, and again after it ends. Every copy is a duplicate (no second
call: the partner counts calls per invoiceId, and would answer a second one 409),
every new invoice is called once, the consumer exits 0 and never says "database is
locked", and prune removed exactly the old rows. Copies of pruned (outside the window)
invoices take effect again: that is what a window means, and the test shows it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli_support import invoke
from mq_support import partner, wait_for
from onceq._ledger.target import open_ledger
from retention_support import backdate, ok

pytestmark = pytest.mark.slow

N_OLD = 40_000  # rows 40 days old: enough batches of BATCH that prune lasts a while
# Small: prune lasts a while (10,000 batches), well over the consumer's 0.5 s inbox
# poll (4,000 batches of 10 once ended before the consumer looked), as on a big ledger.
BATCH = 4
N_RECENT = 200
N_NEW = 50
N_OLD_AGAIN = 5


def _drop(q: Path, name: str, invoice_id: str) -> None:
    """A producer's atomic drop: write a dotfile (never read), then rename into inbox/."""
    body = json.dumps({"invoiceId": invoice_id, "customer": "Acme", "total": 10})
    tmp = q / "inbox" / f".{name}.tmp"
    tmp.write_text(body)
    os.rename(tmp, q / "inbox" / name)


def _done(q: Path) -> int:
    return sum(1 for _ in (q / "done").iterdir())


def _count(target: str, sql: str, args: tuple[Any, ...] = ()) -> int:
    with open_ledger(target, flow="invoices", create=False) as led:
        return int(led._q1(sql, args)[0])


def _old_rows(target: str) -> None:
    """N_OLD messages of flow invoices and their copies' duplicates, 40 days old."""
    with open_ledger(target, flow="invoices") as led:
        for start in range(0, N_OLD, 2000):
            led.commit([ok(f"OLD-{i:06}") for i in range(start, start + 2000)])
        led.commit([ok(f"OLD-{i:06}", f"copy-{i}.json") for i in range(100)])
        backdate(led, "messages", "processed_at", "msg_id LIKE ?", ("OLD-%",))
        backdate(led, "duplicates", "seen_at", "msg_id LIKE ?", ("OLD-%",))


def test_prune_beside_a_running_consumer(ledger_target: str, tmp_path: Path) -> None:
    q = tmp_path / "q"
    assert invoke("dirq", "init", str(q)).returncode == 0
    _old_rows(ledger_target)
    with partner(kind="invoices") as p:
        flows = tmp_path / "flows.toml"
        flows.write_text(
            f"ledger = {json.dumps(ledger_target)}\n"
            '[flows.invoices]\nsource = "dirq"\npath = "./q"\nid_field = "invoiceId"\n'
            f'[flows.invoices.http]\nurl = "{p.url}/api/invoices"\n'
        )
        consumer = subprocess.Popen(
            [sys.executable, "-m", "onceq", "run", str(flows), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        prune = None
        try:
            for i in range(N_RECENT):
                _drop(q, f"inv-{i:03}.json", f"INV-{i:03}")
            wait_for(lambda: _done(q) == N_RECENT, timeout=60)
            recent = "SELECT count(*) FROM messages WHERE msg_id LIKE ?"
            assert _count(ledger_target, recent, ("INV-%",)) == N_RECENT

            # The copies, and new invoices, are in the inbox when prune starts deleting,
            # and the consumer takes them then: it is held (SIGSTOP, idle: no lock, no
            # transaction open) while they are dropped, and let go once prune has
            # removed its first batch, so that its 0.5 s inbox poll cannot let a fast
            # prune end before the first copy is looked at.
            os.kill(consumer.pid, signal.SIGSTOP)
            try:
                for i in range(N_RECENT):
                    _drop(q, f"copy1-inv-{i:03}.json", f"INV-{i:03}")
                for i in range(N_NEW):
                    _drop(q, f"new-{i:03}.json", f"NEW-{i:03}")
                prune = subprocess.Popen(
                    [sys.executable, "-m", "onceq", "ledger", "prune", "--older-than", "30d",
                     "--db", ledger_target, "--batch", str(BATCH), "--json"],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )  # fmt: skip
                old = "SELECT count(*) FROM messages WHERE msg_id LIKE ?"
                wait_for(lambda: _count(ledger_target, old, ("OLD-%",)) < N_OLD, timeout=60)
            finally:
                os.kill(consumer.pid, signal.SIGCONT)
            # The consumer records duplicates while prune is still deleting: read the
            # count first, then see prune still running (so it ran at the read too).
            dups = "SELECT count(*) FROM duplicates WHERE msg_id LIKE ?"
            beside = 0

            def consumer_moved() -> bool:
                nonlocal beside
                n = _count(ledger_target, dups, ("INV-%",))
                if prune.poll() is None:  # type: ignore[union-attr]
                    beside = n
                return prune.poll() is not None or n > 0  # type: ignore[union-attr]

            wait_for(consumer_moved, timeout=120)
            out, err = prune.communicate(timeout=300)
            assert prune.returncode == 0, err
            assert beside > 0, "no copy was recorded while prune ran: not beside"
            report = json.loads(out)
            assert report["removed"]["messages"] == {"invoices": N_OLD}
            assert report["removed"]["duplicates"] == {"invoices": 100}

            # After prune: copies again, and copies of pruned (outside the window) ones.
            for i in range(N_RECENT):
                _drop(q, f"copy2-inv-{i:03}.json", f"INV-{i:03}")
            for i in range(N_OLD_AGAIN):
                _drop(q, f"old-again-{i}.json", f"OLD-{i:06}")
            total = N_RECENT * 3 + N_NEW + N_OLD_AGAIN
            wait_for(lambda: _done(q) == total, timeout=120)
        finally:
            if prune is not None and prune.poll() is None:
                prune.kill()
                prune.wait()
            consumer.send_signal(signal.SIGTERM)
            out, err = consumer.communicate(timeout=60)
        calls = p.stats()["by_id"]
    assert consumer.returncode == 0, err
    assert "database is locked" not in err and "Traceback" not in err, err
    summary = json.loads(out)["flows"]["invoices"]
    assert summary["processed"] == N_RECENT + N_NEW + N_OLD_AGAIN
    assert summary["duplicates"] == 2 * N_RECENT
    assert summary["partner_duplicates"] == 0  # no invoice was POSTed a second time
    assert summary["quarantined"] == 0 and summary["requeued"] == 0, summary
    # Called once each: recent ones before prune (never again), the new ones, and the
    # pruned ones whose copies came after the window let them go.
    want = {f"INV-{i:03}" for i in range(N_RECENT)} | {f"NEW-{i:03}" for i in range(N_NEW)}
    want |= {f"OLD-{i:06}" for i in range(N_OLD_AGAIN)}
    assert calls == dict.fromkeys(want, 1)
    assert _count(ledger_target, "SELECT count(*) FROM messages", ()) == len(want)
    assert not any((q / "inbox").iterdir()) and not any((q / "error").iterdir())
