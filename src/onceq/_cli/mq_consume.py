"""`onceq mq consume`: the claims preset (--claim) or a user's own flow (--url)."""

from __future__ import annotations

from typing import Any

import click

from onceq._cli.broker_consume_options import consume_options
from onceq._cli.broker_run import Where, consume_and_report
from onceq._cli.flow_flags import over_preset, own_flow
from onceq._cli.flow_options import check_http_flags, is_generic
from onceq._cli.mq import cli_url
from onceq._cli.ops_options import pop_ops, telemetry_for
from onceq._core.logs import setup as setup_logs
from onceq._exercise.claims import claims_flow
from onceq._ledger.target import Target
from onceq._sources.amqp.consume import default_db
from onceq._sources.amqp.topology import QUEUE
from onceq.errors import UsageError


@click.command()
@click.option(
    "--claim",
    "claim_url",
    metavar="URL",
    help="Claim system base URL: the exercise's claims preset (claim.in, POST"
    " CLAIM/v1/claims, 201 only).",
)
@click.option(
    "--queue",
    metavar="QUEUE",
    help="The queue to consume (default claim.in); with --url, your own flow.",
)
@consume_options(
    required_help="Comma-separated fields a message must have besides its id (your own flow).",
    prefetch_default=5,
    prefetch_help="Unacked deliveries at most (basic_qos), handled concurrently.",
    db_help="Ledger: an SQLite file (default: EAI_MQ_DB, else ./processed.db; its folder must"
    " exist) or a postgresql://USER:PASSWORD@HOST:PORT/DATABASE URL (a shared ledger).",
    until_empty_help="A batch: stop once the queue is drained and nothing is in flight.",
)
def consume(
    claim_url: str | None,
    queue: str | None,
    required: str | None,
    max_seconds: float | None,
    prefetch: int,
    db: Target | None,
    timeout: float,
    until_empty: bool,
    as_json: bool,
    **flags: Any,
) -> None:
    """Consume claim.in, POST each claim to CLAIM/v1/claims, ack after the ledger.

    201 → recorded, then acked. 422 → dead-lettered at once. A message_id
    already in the ledger is acked without a call. 503, other statuses,
    connection errors and timeouts are transient: retried once at once, then
    after 5s, 30s, 2m and 10m (each wait a copy in a retry queue,
    claim.retry.5s …, declared by `onceq mq topology`), then dead-lettered. A
    Retry-After on a 429/503 picks a wait at least that long. --retry exercise
    is the exercise's rule instead (requeued once, then dead-lettered); the
    lab's consumer.py passes it, with --no-breaker.

    The circuit breaker (on unless --no-breaker): after 5 transient failures in a
    row on different messages, no new call starts; the messages taken meanwhile go
    back to the queue untried (no attempt spent: the partner is down, not them),
    the consumer stops taking more, and one message probes the partner after 1s,
    2s, 4s … (at most 30s); a success closes it. One log line per change.

    Your own flow instead of --claim: --url URL (and --queue, --id-field …)
    POSTs each message of --queue to URL: 2xx done, 409 done as a partner
    duplicate, other 4xx dead at once, 5xx/408/425/429 and timeouts retried as
    above (see --success … --transient); its retry queues are QUEUE's stem +
    .retry.5s …. The id is the message_id property, else the --id-field of the
    body.

    Signals: this consumer runs until it is stopped, so a stop is its normal end:
    SIGTERM, SIGINT or --max-seconds take nothing more, finish the in-flight
    messages, print the summary and exit 0. A second signal stops at once (exit
    130; the in-flight messages return to the queue). On a terminal a status line
    on stderr shows the progress; piped, nothing.

    Your own flow (--url) has a misconfiguration guard: when the first 10
    messages all fail permanently for the same reason (a 404 URL, a 401/403, a
    missing field) it stops before dead-lettering the rest, which stay in the
    queue, and exits 10 with one line naming the URL or field (--guard-failures
    N, --no-guard). The claims preset (--claim) has none.

    --until-empty makes it a batch: it stops once the queue (claim.in, or --queue)
    has nothing ready, no retry queue holds a copy, the breaker is closed and every
    delivery it took is settled, and exits 0 (11 when every message of your own
    flow failed). Like every batch that is to finish
    a queue (dirq consume), it exits 130 (SIGINT) / 143 (SIGTERM) when a signal
    stops it first, and 1 when --max-seconds runs out first, so that a script
    knows it did not finish.

    --metrics-port PORT serves Prometheus metrics at http://127.0.0.1:PORT/metrics
    (--metrics-host to listen elsewhere) and /healthz: 200 while connected to the
    broker and not stopping, else 503. A port in use exits 4 before anything is
    consumed.

    \b
    Example:
      onceq partner claim --port 9202 &
      onceq mq topology
      onceq mq consume --claim http://127.0.0.1:9202 --max-seconds 30 --prefetch 5
      onceq mq consume --claim http://127.0.0.1:9202 --until-empty --json
      onceq mq consume --claim http://127.0.0.1:9202 --metrics-port 9464
      onceq mq consume --claim http://127.0.0.1:9202 --retry exercise --no-breaker
      onceq mq topology --retry-delays 1s,10s
      onceq mq consume --claim http://127.0.0.1:9202 --retry-delays 1s,10s
      onceq mq consume --queue invoice.in --id-field invoiceId \\
          --url http://127.0.0.1:9300/api/invoices --until-empty
    """
    ops = pop_ops(flags)
    url = cli_url()
    setup_logs(ops.log_format, ops.log_level)
    telemetry = telemetry_for(ops)
    flow = _consume_flow(url, claim_url, queue, required, prefetch, timeout, flags)
    qname = flow.source.queue
    consume_and_report(
        flow,
        db or default_db(),
        Where(qname, unsettled=f"back to {qname}", in_flight=f"return to {qname}"),
        until_empty=until_empty,
        max_seconds=max_seconds,
        telemetry=telemetry,
        as_json=as_json,
    )


def _consume_flow(
    url: str,
    claim_url: str | None,
    queue: str | None,
    required: str | None,
    prefetch: int,
    timeout: float,
    flags: dict[str, Any],
) -> Any:
    """--claim: the claims preset; --url (and the spec flags): the user's own flow, both
    with the retry, breaker and guard flags (onceq._cli.flow_flags: the flow file's builder)."""
    if claim_url is not None:
        if is_generic(flags) or queue is not None or required is not None:
            raise UsageError(
                "--claim is the claims preset (claim.in, CLAIM/v1/claims); for your own flow"
                " give --url and --queue instead, not both"
            )
        check_http_flags(flags, preset=True)
        flow = claims_flow(claim_url, url=url, prefetch=prefetch, timeout=timeout)
        flow.name = flags.get("flow_name") or flow.name
        return over_preset(flow.validate(), flags)
    if not flags.get("http_url"):
        raise UsageError(
            "mq consume: give --claim URL (the claims preset) or --url URL (your own"
            " flow) (see onceq mq consume --help)"
        )

    check_http_flags(flags)
    values = {**flags, "required": required, "queue": queue or QUEUE, "prefetch": prefetch}
    fixed = {"url": url, "id_property": True, "http.timeout": timeout, "http.concurrency": prefetch}
    return own_flow("rabbitmq", values, fixed)
