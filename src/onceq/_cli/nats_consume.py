"""`onceq nats consume`: your own flow over a durable pull consumer (--url, the flow flags)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from onceq._cli.broker_consume_options import consume_options
from onceq._cli.flow_flags import own_flow
from onceq._cli.flow_options import check_http_flags
from onceq._cli.nats import cli_url
from onceq._cli.ops_options import pop_ops, telemetry_for
from onceq._cli.output import emit_json, note_new_ledger, print_run_summary
from onceq._cli.progress import live_progress
from onceq._core.hooks import RunHooks
from onceq._core.logs import setup as setup_logs
from onceq._core.stop import Stop
from onceq._flows.batch import run_report
from onceq._flows.run_end import run_error
from onceq._ledger.target import Target, describe
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
    ledger = db or Path(DEFAULT_DB)
    where = f"{stream}/{durable}"
    hooks = RunHooks()
    hooks.ledger_created.append(note_new_ledger)
    with live_progress(where, "dead", hooks):
        report = run_report(
            [flow],
            ledger,
            until_empty=until_empty,
            max_seconds=max_seconds,
            telemetry=telemetry,
            hooks=hooks,
            stop=Stop(second="abort", respect_ignored=False),
        )
    name = flow.name
    result = {
        **report.stats[name].as_dict(),
        "unsettled": report.unsettled.get(name, 0),
        "db": describe(ledger),
        "aborted": report.aborted,
    }
    if until_empty:
        result["drained"] = report.drained[name]
    if as_json:
        emit_json(result)
    else:
        tail = f", {result['unsettled']} unsettled (redelivered)" if result["unsettled"] else ""
        if result.get("drained"):
            tail += f"; {where} drained"
        print_run_summary(report.stats[name], tail=f"{tail}; ledger {describe(ledger)}")
    error = run_error(
        report,
        [flow],
        batch=until_empty,
        where=lambda _f: where,
        unfinished=lambda sig, aborted: _unfinished(sig, aborted, max_seconds, where),
    )
    if error is not None:
        raise error


def _unfinished(
    signal_name: str | None, aborted: bool, max_seconds: float | None, where: str
) -> str:
    if aborted:
        return f"interrupted by a second signal; in-flight messages are redelivered by {where}"
    if signal_name is not None:
        return f"stopped by {signal_name} before {where} was drained; the rest waits there"
    within = f" within --max-seconds {max_seconds:g}" if max_seconds is not None else ""
    return f"{where} not drained{within}; the rest waits there"
