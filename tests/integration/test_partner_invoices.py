"""The invoice-partner stub (`onceq partner invoices`) as a real process.

Its rules (400 / 422 / 503 / 409 / 201, a memory of the invoiceIds it accepted), its
/_stats and key checks, the hold gate, the delay, and the command's refusals.
"""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from cli_support import invoke
from mq_support import partner, post, wait_for

INVOICE = {"invoiceId": "INV-1", "customer": "ACME", "total": 120.5}


def _post(
    url: str, body: dict[str, Any] | bytes, key: str | None = None, path: str = "/api/invoices"
) -> tuple[int, dict[str, Any]]:
    """POST a body (a dict is sent as JSON) with Idempotency-Key `key`; (status, answer)."""
    return post(f"{url}{path}", body if isinstance(body, bytes) else json.dumps(body).encode(), key)


def invoice(invoice_id: str, **fields: Any) -> dict[str, Any]:
    return {**INVOICE, "invoiceId": invoice_id, **fields}


def _without_total(invoice_id: str) -> dict[str, Any]:
    doc = invoice(invoice_id)
    del doc["total"]
    return doc


# Each case has an id of its own, so the 409 memory plays no part here.
STATUS_CASES: list[tuple[str, dict[str, Any] | bytes, int]] = [
    ("not JSON", b"not json", 400),
    ("a JSON array", b'[{"invoiceId": "A-1", "total": 1}]', 400),
    ("a JSON string", b'"A-2"', 400),
    ("invoiceId missing", {"customer": "ACME", "total": 1}, 400),
    ("invoiceId a number", invoice("x", invoiceId=7), 400),
    ("invoiceId null", invoice("x", invoiceId=None), 400),
    ("invoiceId empty", invoice(""), 400),
    ("total missing", _without_total("T-1"), 422),
    ("total a string", invoice("T-2", total="120.5"), 422),
    ("total true", invoice("T-3", total=True), 422),
    ("total null", invoice("T-4", total=None), 422),
    ("total negative", invoice("T-5", total=-0.01), 422),
    ("total NaN", b'{"invoiceId": "T-6", "customer": "ACME", "total": NaN}', 422),
    ("total Infinity", b'{"invoiceId": "T-7", "customer": "ACME", "total": Infinity}', 422),
    ("total an object", invoice("T-8", total={"amount": 1}), 422),
    ("customer BUSY", invoice("B-1", customer="BUSY-1"), 503),
    ("customer BUSY, no total", _without_total("B-2") | {"customer": "BUSY"}, 422),
    ("customer BUSY, no id", {"customer": "BUSY", "total": 1}, 400),
    ("BUSY not at the start", invoice("B-3", customer="ACME BUSY"), 201),
    ("customer missing", {"invoiceId": "C-1", "total": 1}, 201),
    ("total zero", invoice("Z-1", total=0), 201),
    ("total an integer", invoice("Z-2", total=7), 201),
    ("the invoice example", INVOICE, 201),
]


def test_each_status_rule() -> None:
    with partner(keys=False, kind="invoices") as p:
        got = {name: _post(p.url, body)[0] for name, body, _ in STATUS_CASES}
        assert got == {name: want for name, _, want in STATUS_CASES}
        assert p.stats()["total"] == len(STATUS_CASES)
        # Its own path only: the claim system's route is not this partner's.
        assert _post(p.url, INVOICE, "INV-1", path="/v1/claims")[0] == 404


def test_409_for_an_id_it_has_201_for_another_and_only_201_is_remembered() -> None:
    with partner(kind="invoices") as p:
        assert _post(p.url, INVOICE, "INV-1") == (201, {"status": "created", "invoiceId": "INV-1"})
        status, answer = _post(p.url, INVOICE, "INV-1")
        assert status == 409 and answer["invoiceId"] == "INV-1"
        assert _post(p.url, invoice("INV-2"), "INV-2")[0] == 201  # another id
        assert _post(p.url, invoice("INV-1", total=5), "INV-1")[0] == 409  # still had
        # A 503 or a 422 created nothing: the same id, valid, is a 201 afterwards.
        assert _post(p.url, invoice("INV-3", customer="BUSY-X"), "INV-3")[0] == 503
        assert _post(p.url, invoice("INV-3"), "INV-3")[0] == 201
        assert _post(p.url, invoice("INV-4", total=-1), "INV-4")[0] == 422
        assert _post(p.url, invoice("INV-4"), "INV-4")[0] == 201
        assert _post(p.url, invoice("INV-4"), "INV-4")[0] == 409
        stats = p.stats()
        assert stats["by_status"] == {"201": 4, "409": 3, "503": 1, "422": 1}
        assert stats["by_id"] == {"INV-1": 3, "INV-2": 1, "INV-3": 2, "INV-4": 3}
        assert p.stop() == 0  # SIGTERM stops it cleanly


def test_stats_count_every_call_and_check_the_key_against_the_invoice_id() -> None:
    with partner(keys=False, kind="invoices") as p:
        assert _post(p.url, INVOICE, "INV-1")[0] == 201
        assert _post(p.url, invoice("INV-2", total=-1), "INV-2")[0] == 422
        p.check_keys()  # right keys pass, whatever the status …
        assert _post(p.url, invoice("INV-3"), "INV-9")[0] == 201  # … a wrong key is counted …
        assert _post(p.url, invoice("INV-1"))[0] == 409  # … and so is a missing one
        assert _post(p.url, b"not json", "K-1")[0] == 400  # no body id: a mismatch
        stats = p.stats()
        assert stats == {
            "total": 5,
            "by_id": {"INV-1": 2, "INV-2": 1, "INV-3": 1, "K-1": 1},
            "by_status": {"201": 2, "422": 1, "409": 1, "400": 1},
            "by_key": {"INV-1": 1, "INV-2": 1, "INV-9": 1, "K-1": 1},
            "key_missing": 1,
            "key_mismatch": 3,
            "peak_in_flight": 1,
            "held": 0,
            "held_keys": [],
            "outage": None,
            "calls_during_outage": 0,
        }
        with pytest.raises(AssertionError):
            p.check_keys()
        # /_reset: a fresh stub, its stats and the invoiceIds it had both forgotten.
        req = urllib.request.Request(f"{p.url}/_reset", method="POST", data=b"")
        urllib.request.urlopen(req, timeout=5).close()
        fresh = p.stats()
        assert (fresh["total"], fresh["by_id"], fresh["by_key"], fresh["key_mismatch"]) == (
            0,
            {},
            {},
            0,
        )
        assert _post(p.url, INVOICE, "INV-1")[0] == 201
        p.check_keys()


def test_hold_and_release_and_the_first_released_call_is_the_one_accepted() -> None:
    """Two calls for INV-1 held together: the partner decides when it answers, so the
    one released first gets the 201 and the other the 409."""
    with partner(kind="invoices") as p:
        p.hold()
        keys = ["INV-1", "INV-1", "INV-2"]
        with ThreadPoolExecutor(3) as pool:
            calls = []
            for i, key in enumerate(keys):
                calls.append(pool.submit(_post, p.url, invoice(key), key))
                wait_for(lambda i=i: p.held() == i + 1, timeout=10)  # in this order
            stats = p.stats()
            assert stats["held_keys"] == keys and stats["total"] == 3
            assert stats["by_status"] == {}  # counted, not answered
            assert not any(c.done() for c in calls)
            assert p.release(1) == 1
            assert calls[0].result(timeout=10)[0] == 201
            assert p.stats()["held_keys"] == ["INV-1", "INV-2"]
            assert not any(c.done() for c in calls[1:])
            assert p.release() == 2
            assert [c.result(timeout=10)[0] for c in calls] == [201, 409, 201]
        assert _post(p.url, invoice("INV-3"), "INV-3")[0] == 201  # no longer holding
        assert p.stats()["held"] == 0 and p.stats()["peak_in_flight"] == 3
        p.hold()  # a held call does not keep a stopping stub alive
        with ThreadPoolExecutor(1) as pool:
            late = pool.submit(_post, p.url, invoice("INV-4"), "INV-4")
            wait_for(lambda: p.held() == 1, timeout=10)
            assert p.stop() == 0
            late.exception(timeout=10)  # answered or cut off, but not hanging


def test_delay_applies_to_every_call_and_concurrent_calls_overlap() -> None:
    delay = 1.0
    with partner(delay=delay, kind="invoices") as p:
        p.hold()
        with ThreadPoolExecutor(4) as pool:
            calls = [pool.submit(_post, p.url, invoice(f"D-{i}"), f"D-{i}") for i in range(4)]
            wait_for(lambda: p.held() == 4, timeout=15)  # all 4 in flight at once
            t0 = time.monotonic()
            p.release()
            codes = [c.result(timeout=30)[0] for c in calls]
            took = time.monotonic() - t0
        assert codes == [201] * 4
        assert took >= delay  # the delay is applied …
        assert took < 3 * delay, took  # … once, not 4 times in a row


def test_a_busy_port_is_refused_in_one_line() -> None:
    with partner(kind="invoices") as p:
        r = invoke("partner", "invoices", "--port", str(p.port), timeout=20)
        assert p.proc.poll() is None  # the running stub is untouched
        assert _post(p.url, INVOICE, "INV-1")[0] == 201
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("onceq: ") and str(p.port) in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert r.stdout == ""  # never claimed to be listening


def test_command_help_and_option_refusals() -> None:
    r = invoke("partner", "invoices", "--help")
    assert r.returncode == 0, r.stderr
    assert "Example:" in r.stdout and "onceq partner invoices --port 9300" in r.stdout
    assert "default: 9300" in r.stdout
    for args in (["--delay", "nan"], ["--delay", "-1"], ["--port", "70000"]):
        r = invoke("partner", "invoices", "--port", "0", *args)
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == "", (args, r.stderr)
