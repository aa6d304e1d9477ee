"""`onceq partner …`: the partner stubs (one engine, a rule set per partner)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from onceq._cli.output import Seconds
from onceq._exercise.partner import Claims, Invoices, run_stub
from onceq.errors import UsageError


@click.group()
def partner() -> None:
    """Stub partner systems for demos, tests and benchmarks.

    Each stub answers by its partner's rules, counts every call (GET /_stats) and can
    hold calls until released (POST /_hold, POST /_release[?n=K]); POST /_reset
    makes it a fresh stub. It can be down for a while, then back by itself:
    --down-for/--down-as from its start, or POST /_outage?mode=M&seconds=S later
    (refuse: connections refused; 503: every call answered 503, with Retry-After
    when given; hang: calls answered only after the window, with 504). It runs
    until SIGTERM/SIGINT.

    \b
    Example:
      onceq partner claim --port 9202 --delay 0.05 &
      onceq partner invoices --port 9300 &
      onceq partner claim --port 9203 --down-for 12 --down-as refuse &
      curl -s -X POST 'http://127.0.0.1:9202/_outage?mode=503&seconds=5&retry_after=2'
    """


def _stub_options(default_port: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--port, --host, --delay and the outage, the same for every stub but the port."""

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        f = click.option(
            "--retry-after",
            type=click.IntRange(0, 86_400),
            default=None,
            help="With --down-as 503: the Retry-After header's seconds.",
        )(f)
        f = click.option(
            "--down-as",
            type=click.Choice(["refuse", "503", "hang"]),
            default=None,
            help="How it is down (with --down-for): refuse connections [default],"
            " answer 503, or hang until the window ends (then 504).",
        )(f)
        f = click.option(
            "--down-for",
            type=Seconds(min=0, min_open=True, max=86_400),
            default=None,
            help="Down for this many seconds from its start, then up by itself.",
        )(f)
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


def _down(
    down_for: float | None, down_as: str | None, retry_after: int | None
) -> tuple[str, float, int | None] | None:
    """The outage the options ask for (mode, seconds, retry_after), or None."""

    if down_for is None:
        if down_as is not None or retry_after is not None:
            flag = "--down-as" if down_as is not None else "--retry-after"
            raise UsageError(f"{flag}: needs --down-for SECONDS")
        return None
    mode = down_as or "refuse"
    if retry_after is not None and mode != "503":
        raise UsageError("--retry-after: only with --down-as 503 (a header of the 503 answer)")
    return mode, down_for, retry_after


@partner.command()
@_stub_options(9202)
def claim(
    port: int,
    host: str,
    delay: float,
    down_for: float | None,
    down_as: str | None,
    retry_after: int | None,
) -> None:
    """Run the claim-system stub until SIGTERM/SIGINT.

    POST /v1/claims: 422 when docs is missing or empty, 503 when claimId starts
    with BUSY, 400 for a body that is not a JSON object, else 201.
    GET /_stats: total, by_guid, by_claim, by_status, by_key, key_missing,
    key_mismatch, peak_in_flight, held, held_keys. POST /_reset clears them.

    \b
    Example:
      onceq partner claim --port 9202 --delay 0.5 &
      curl -s http://127.0.0.1:9202/_stats
      onceq partner claim --port 9202 --down-for 12 --down-as 503 --retry-after 5
    """

    run_stub(Claims, host, port, delay, _down(down_for, down_as, retry_after))


@partner.command()
@_stub_options(9300)
def invoices(
    port: int,
    host: str,
    delay: float,
    down_for: float | None,
    down_as: str | None,
    retry_after: int | None,
) -> None:
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

    run_stub(Invoices, host, port, delay, _down(down_for, down_as, retry_after))
