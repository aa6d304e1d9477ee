"""Helpers for the /metrics and /healthz tests: scrape as Prometheus does, parse as it does.

Numbers are read with prometheus_client's own parser (never a regex on the text), so a
test sees exactly what a Prometheus server would store.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# Every file of the invoices queue the dirq tests build, and what each becomes.
INVOICES: dict[str, Any] = {
    "a1.json": {"invoiceId": "INV-1", "customer": "ACME", "total": 10},
    "a2.json": {"invoiceId": "INV-2", "customer": "ACME", "total": 20},
    "a3.json": {"invoiceId": "INV-3", "customer": "ACME", "total": 30},
    "a4.json": {"invoiceId": "INV-4", "customer": "ACME", "total": 40},
    "a5.json": {"invoiceId": "INV-5", "customer": "ACME", "total": 50},
    "b1.json": {"invoiceId": "INV-6", "customer": "ACME"},  # no total: 422, dead
    "b2.json": {"invoiceId": "INV-7", "customer": "ACME"},  # no total: 422, dead
    "c1.json": {"invoiceId": "INV-8", "customer": "BUSY-1", "total": 1},  # 503: retried, dead
    "d1.json": b"{not json",  # parse: dead, no call
    "z1.json": {"invoiceId": "INV-1", "customer": "ACME", "total": 10},  # a duplicate
}


def make_invoices(root: Path) -> Path:
    for sub in ("inbox", "processing", "done", "error"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for name, doc in INVOICES.items():
        body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        (root / "inbox" / name).write_bytes(body)
    return root


def get(port: int, path: str) -> tuple[int, str]:
    """(status, body) of GET http://127.0.0.1:PORT/PATH; an error status is returned."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def healthz(port: int) -> tuple[int, dict[str, Any]]:
    status, body = get(port, "/healthz")
    return status, json.loads(body)


def answers(port: int) -> bool:
    try:
        get(port, "/healthz")
        return True
    except OSError:
        return False


class Scrape:
    """One scrape of /metrics, parsed: samples by name, each a (labels, value) list."""

    def __init__(self, port: int) -> None:
        status, self.text = get(port, "/metrics")
        assert status == 200, self.text
        self.samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
        self.types: dict[str, str] = {}
        for family in text_string_to_metric_families(self.text):
            self.types[family.name] = family.type
            for s in family.samples:
                self.samples[s.name].append((dict(s.labels), s.value))

    def by(self, name: str, label: str, **match: str) -> dict[str, float]:
        """{label value: sample value} of `name`'s samples whose labels match `match`."""
        out = {}
        for labels, value in self.samples.get(name, []):
            if all(labels.get(k) == v for k, v in match.items()):
                out[labels[label]] = value
        return out

    def value(self, name: str, **match: str) -> float | None:
        for labels, value in self.samples.get(name, []):
            if all(labels.get(k) == v for k, v in match.items()):
                return value
        return None

    def messages(self, flow: str) -> dict[str, float]:
        return self.by("onceq_messages_total", "outcome", flow=flow)

    def failures(self, flow: str) -> dict[str, float]:
        return self.by("onceq_failures_total", "reason", flow=flow)

    def dead(self, flow: str) -> dict[str, float]:
        return self.by("onceq_dead_total", "reason", flow=flow)

    def settled(self, flow: str) -> float:
        return sum(self.messages(flow).values())


def expected_messages(summary: dict[str, Any], dead_word: str = "dead") -> dict[str, float]:
    """onceq_messages_total's outcomes as a --json summary counts them."""
    return {
        "processed": summary["processed"],
        "duplicate": summary["duplicates"],
        "partner_duplicate": summary["partner_duplicates"],
        "recovered": summary["recovered"],
        "retried": summary["requeued"],
        "held": summary["held"],
        "dead": summary[dead_word],
    }


def expected_failures(summary: dict[str, Any]) -> dict[str, float]:
    """onceq_failures_total's reasons: the dead letters' and the retries' summed."""
    out: dict[str, float] = defaultdict(float)
    for reasons in (summary["reasons"], summary["requeued_reasons"]):
        for reason, n in reasons.items():
            out[reason] += n
    return dict(out)
