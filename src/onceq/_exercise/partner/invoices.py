"""The invoice partner's rules (`onceq partner invoices`), run by the stub engine.

    POST /api/invoices  400 body not a JSON object, or invoiceId missing, empty or
                            not a string
                        422 total missing, not a number, or negative   (rejection)
                        503 customer starts with BUSY                  (transient)
                        409 an invoiceId this partner already accepted (a duplicate)
                        201 otherwise, and the invoiceId is remembered
    /_stats counts calls by_id (invoiceId).

Unlike the claim system, this partner deduplicates as real ones do: it remembers every
invoiceId it answered 201 and answers 409 to it from then on, so a consumer that
calls twice sees the "already have it" a real partner would give (and the tests can
prove that 409 is recorded as done). Only a 201 is remembered: a 422 or a 503 did
not create the invoice, so a later valid call for that id is still a 201.
The checks run in the order above: a body the partner cannot read, then one it
refuses, then a busy partner (which looks at nothing further), then the memory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar


def _bad_total(total: Any) -> bool:
    # bool is an int in Python but `true` is no amount; NaN/Infinity (which json.loads
    # accepts) are not numbers a partner could book.
    if isinstance(total, bool) or not isinstance(total, int | float):
        return True
    return not math.isfinite(total) or total < 0


class Invoices:
    title = "invoice partner"
    path = "/api/invoices"
    id_field = "invoiceId"
    id_stat = "by_id"
    tallies: ClassVar[Mapping[str, str]] = {}
    default_port = 9300

    def __init__(self) -> None:
        self.accepted: set[str] = set()  # the invoiceIds answered 201

    def answer(self, doc: Any, ident: str) -> tuple[int, dict[str, Any]]:
        if not isinstance(doc, dict):
            return 400, {"error": "body is not a JSON object"}
        invoice_id = doc.get("invoiceId")
        if not isinstance(invoice_id, str) or not invoice_id:
            return 400, {"error": "invoiceId missing or not a string"}
        if _bad_total(doc.get("total")):
            return 422, {"error": "total missing, not a number, or negative"}
        customer = doc.get("customer")
        if isinstance(customer, str) and customer.startswith("BUSY"):
            return 503, {"error": "invoice partner busy"}
        if invoice_id in self.accepted:
            return 409, {"error": "invoice already exists", "invoiceId": invoice_id}
        self.accepted.add(invoice_id)
        return 201, {"status": "created", "invoiceId": invoice_id}

    def reset(self) -> None:
        self.accepted.clear()
