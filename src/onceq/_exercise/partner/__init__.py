"""Partner stubs for demos, tests and benchmarks: one engine, one rule set per partner.

engine.py    counting (/_stats), the hold gate, the delay, serving and signals
claims.py    the claim system: POST /v1/claims      (`onceq partner claim`)
invoices.py  the invoice partner: POST /api/invoices (`onceq partner invoices`)
"""

from __future__ import annotations

from onceq._exercise.partner.claims import Claims, classify
from onceq._exercise.partner.engine import RuleSet, Stats, make_app, run_stub, serve
from onceq._exercise.partner.invoices import Invoices

__all__ = [
    "Claims",
    "Invoices",
    "RuleSet",
    "Stats",
    "classify",
    "make_app",
    "run",
    "run_stub",
    "serve",
]


def run(host: str = "127.0.0.1", port: int = 9202, delay: float = 0.0) -> None:
    """The claim-system stub (what `from onceq._exercise.partner import run` always started)."""
    run_stub(Claims, host, port, delay)
