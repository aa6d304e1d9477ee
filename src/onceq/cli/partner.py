"""`onceq partner …`: the partner stubs (one engine, a rule set per partner)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from onceq.cli.output import Seconds


@click.group()
def partner() -> None:
    """Stub partner systems for demos, tests and benchmarks.

    Each stub answers by its partner's rules, counts every call (GET /_stats) and can
    hold calls until released (POST /_hold, POST /_release[?n=K]); POST /_reset
    makes it a fresh stub. It runs until SIGTERM/SIGINT.

    \b
    Example:
      onceq partner claim --port 9202 --delay 0.05 &
      onceq partner invoices --port 9300 &
    """


def _stub_options(default_port: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--port, --host and --delay, the same for every stub but the port's default."""

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        f = click.option(
            "--delay",
            default=0.0,
            show_default=True,
            type=Seconds(min=0),
            help="Seconds each call takes (asyncio.sleep: concurrent calls overlap).",
        )(f)
        f = click.option("--host", default="127.0.0.1", show_default=True)(f)
        return click.option(
            "--port", default=default_port, show_default=True, type=click.IntRange(0, 65535)
        )(f)

    return wrap


@partner.command()
@_stub_options(9202)
def claim(port: int, host: str, delay: float) -> None:
    """Run the claim-system stub until SIGTERM/SIGINT.

    POST /v1/claims: 422 when docs is missing or empty, 503 when claimId starts
    with BUSY, 400 for a body that is not a JSON object, else 201.
    GET /_stats: total, by_guid, by_claim, by_status, by_key, key_missing,
    key_mismatch, peak_in_flight, held, held_keys. POST /_reset clears them.

    \b
    Example:
      onceq partner claim --port 9202 --delay 0.5 &
      curl -s http://127.0.0.1:9202/_stats
    """
    from onceq.partner import Claims, run_stub

    run_stub(Claims, host, port, delay)


@partner.command()
@_stub_options(9300)
def invoices(port: int, host: str, delay: float) -> None:
    """Run the invoice-partner stub until SIGTERM/SIGINT.

    POST /api/invoices: 400 for a body that is not a JSON object or whose invoiceId
    is missing or not a string, 422 when total is missing, not a number or negative,
    503 when customer starts with BUSY, 409 for an invoiceId it already accepted,
    else 201 (and the invoiceId is remembered).
    GET /_stats: total, by_id, by_status, by_key, key_missing, key_mismatch (the
    Idempotency-Key header vs the body's invoiceId), peak_in_flight, held, held_keys.
    POST /_reset forgets the stats and the invoiceIds.

    \b
    Example:
      onceq partner invoices --port 9300 &
      curl -s -X POST http://127.0.0.1:9300/api/invoices \\
           -H 'Idempotency-Key: INV-1' \\
           -d '{"invoiceId": "INV-1", "customer": "ACME", "total": 120.5}'
      curl -s http://127.0.0.1:9300/_stats
    """
    from onceq.partner import Invoices, run_stub

    run_stub(Invoices, host, port, delay)
