"""`onceq nats consume`: your own flow over a durable pull consumer (--url, the flow flags)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from onceq._cli.broker_consume_options import consume_options
from onceq._cli.broker_run import Where, consume_and_report
from onceq._cli.flow_flags import own_flow
from onceq._cli.flow_options import check_http_flags
from onceq._cli.nats import cli_url
from onceq._cli.ops_options import pop_ops, telemetry_for
from onceq._core.logs import setup as setup_logs
from onceq._ledger.target import Target
from onceq._sources.nats.names import DEFAULT_PREFETCH
from onceq.errors import UsageError

DEFAULT_DB = "processed.db"


@click.command()
@click.option("--stream", required=True, metavar="S", help="The stream.")
@click.option("--durable", required=True, metavar="D", help="Its durable pull consumer.")
@consume_options(
    required_help="Comma-separated fields a message must have besides its id.",
    prefetch_default=DEFAULT_PREFETCH,
    prefetch_help="Copies this consumer holds at most (one pull's batch), handled concurrently.",
    db_help="Ledger: an SQLite file (default ./processed.db; its folder must exist) or a"
    " postgresql://USER:PASSWORD@HOST:PORT/DATABASE URL (a shared ledger).",
    until_empty_help="A batch: stop once the consumer has nothing pending and nothing in flight.",
)
def consume(
    stream: str,
    durable: str,
    required: str | None,
    max_seconds: float | None,
    prefetch: int,
    db: Target | None,
    timeout: float,
    until_empty: bool,
    as_json: bool,
    **flags: Any,
) -> None:
    """Consume a durable pull consumer's messages into your flow; ack after the ledger.

    --url URL POSTs each message to URL: 2xx done (recorded, then acked), 409 done as
    a partner duplicate, other 4xx dead at once (a copy published to the flow's
    dead-letter subject and stored, then the original acked), 5xx/408/425/429 and
    timeouts retried once at once (NAK), then after 5s, 30s, 2m and 10m (NAK with
    that delay: the server redelivers it), then dead. An id already in the ledger
    is acked without a call. The id is the Nats-Msg-Id header, else the --id-field
    of the body. The server is ONCEQ_NATS_URL (default nats://127.0.0.1:4222); create
    the stream and consumer first with `onceq nats setup`.

    Signals: SIGTERM, SIGINT or --max-seconds take nothing more, finish the in-flight
    messages, print the summary and exit 0 (a second signal: at once, 130/143; the
    server redelivers what was unsettled). --until-empty makes it a batch: it stops
    once the consumer has nothing pending, nothing ack-pending (a delayed retry is
    still pending) and this process holds nothing, and exits 0 (11 when every message
    failed; 130/143 when a signal stops it first, 1 when --max-seconds does).

    \b
    Example:
      onceq nats consume --stream INVOICES --durable onceq --id-field invoiceId \\
          --url http://127.0.0.1:9300/api/invoices --until-empty --json
    """
    ops = pop_ops(flags)
    url = cli_url()
    setup_logs(ops.log_format, ops.log_level)
    telemetry = telemetry_for(ops)
    if not flags.get("http_url") and not flags.get("id_field"):
        raise UsageError(
            "nats consume: give --url URL (the partner) or --id-field F (the ledger row is"
            " the effect) (see onceq nats consume --help)"
        )
    check_http_flags(flags)
    values = {
        **flags,
        "required": required,
        "stream": stream,
        "durable": durable,
        "prefetch": prefetch,
    }
    fixed = {"url": url, "id_property": True, "http.timeout": timeout, "http.concurrency": prefetch}
    flow = own_flow("nats", values, fixed)
    where = f"{stream}/{durable}"
    consume_and_report(
        flow,
        db or Path(DEFAULT_DB),
        Where(where, unsettled="redelivered", in_flight=f"are redelivered by {where}"),
        until_empty=until_empty,
        max_seconds=max_seconds,
        telemetry=telemetry,
        as_json=as_json,
    )
