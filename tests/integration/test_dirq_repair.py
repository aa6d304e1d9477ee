"""Edit-and-replay on a directory queue: a file in error/ corrected in place, replayed
with `onceq dirq replay`, consumed again — processed once, its dead letter gone from
`dead list` and `status`; a corrected file still wrong dies again on fresh attempts.
A repair may also give the message an id (it had none) or change it.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from cli_support import invoke
from mq_support import Partner, partner
from support import SAMPLE

pytestmark = pytest.mark.slow  # real commands and the invoice partner stub, no broker


def _consume(q: Path, stub: Partner, code: int = 0) -> str:
    r = invoke(
        "dirq", "consume", str(q), "--flow", "invoices", "--id-field", "invoiceId",
        "--url", f"{stub.url}/api/invoices", "--retry", "none",
    )  # fmt: skip
    assert r.returncode == code, r.stderr
    return r.stdout


def _dead(q: Path) -> dict[str, tuple[str, int]]:
    r = invoke("dirq", "dead", "list", str(q), "--flow", "invoices", "--json")
    assert r.returncode == 0, r.stderr
    return {x["file"]: (x["reason"], x["attempts"]) for x in json.loads(r.stdout)}


def _replay(q: Path, name: str) -> None:
    r = invoke("dirq", "replay", str(q), name, "--flow", "invoices")
    assert r.returncode == 0, r.stderr


def _rows(q: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(q / "ledger.db")
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_edit_in_error_then_replay(tmp_path: Path) -> None:
    q = tmp_path / "q"
    assert invoke("dirq", "init", str(q), "--from", str(SAMPLE / "invoices")).returncode == 0
    with partner(kind="invoices") as stub:
        assert "3 quarantined" in _consume(q, stub)
        assert _dead(q) == {
            "inv-005-negative.json": ("http-422", 1),
            "inv-006-busy.json": ("http-503", 1),
            "inv-008-no-id.json": ("missing-field", 1),
        }
        err = q / "error"
        # Corrected, still wrong: dead again, on attempts that started again (1, not 2).
        (err / "inv-005-negative.json").write_text(
            '{"invoiceId": "INV-5", "customer": "Umbrella", "total": -6}'
        )
        _replay(q, "inv-005-negative.json")
        assert "1 quarantined" in _consume(q, stub, 11)  # its only message failed again
        assert _dead(q)["inv-005-negative.json"] == ("http-422", 1)
        # Corrected for good (same id); given the id it lacked; its id changed.
        (err / "inv-005-negative.json").write_text(
            '{"invoiceId": "INV-5", "customer": "Umbrella", "total": 5}'
        )
        (err / "inv-008-no-id.json").write_text(
            '{"invoiceId": "INV-8", "customer": "Nobody", "total": 1}'
        )
        (err / "inv-006-busy.json").write_text(
            '{"invoiceId": "INV-6b", "customer": "Busy No More", "total": 10}'
        )
        for name in ("inv-005-negative.json", "inv-006-busy.json", "inv-008-no-id.json"):
            _replay(q, name)
        out = _consume(q, stub)
        assert "3 received, 3 processed, 0 duplicates" in out and "0 quarantined" in out, out
        by_id = stub.stats()["by_id"]
        # INV-5: two 422s, then its one success; the others once each.
        assert (by_id["INV-5"], by_id["INV-8"], by_id["INV-6b"]) == (3, 1, 1), by_id
    assert _dead(q) == {}
    assert sorted(p.name for p in (q / "error").iterdir()) == []
    assert _rows(q, "SELECT msg_id FROM messages WHERE msg_id IN ('INV-5', 'INV-6b', 'INV-8')"
                 " ORDER BY msg_id") == [("INV-5",), ("INV-6b",), ("INV-8",)]  # fmt: skip
    # No dead letter is left on the ledger's books either: each replay undid its death.
    r = invoke("status", "--db", str(q / "ledger.db"), "--flow", "invoices", "--json")
    assert r.returncode == 0, r.stderr
    ledger = json.loads(r.stdout)["flows"]["invoices"]["ledger"]
    assert (ledger["processed"], ledger["dead"]) == (7, 0), ledger
