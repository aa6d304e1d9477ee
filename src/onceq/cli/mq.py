"""`onceq mq …`: the RabbitMQ claims pipeline."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import click

from onceq.cli.flow_options import flow_options
from onceq.cli.output import console, emit_json, fail, note_new_ledger, print_run_summary
from onceq.errors import UsageError

JSON_HELP = "Print the outcome as JSON."
# asyncio is imported inside the commands: every `onceq` command loads this module to
# register its group, and asyncio (with ssl) costs ~20 ms of start-up on its own.


class Seconds(click.FloatRange):
    """A positive, finite number of seconds (FloatRange lets nan and inf through)."""

    name = "seconds"

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        import math

        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return number


def _url() -> str:
    from onceq.amqp.url import amqp_url, setup_logging

    setup_logging()
    return amqp_url()


@click.group()
def mq() -> None:
    """RabbitMQ: topology, confirming publisher, manual-ack consumer with DLQ.

    Every command reads EAI_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/%2F);
    any vhost in it works. Passwords are never printed.

    \b
    Example:
      onceq mq topology
      onceq mq publish claims/*.json
      onceq mq consume --claim http://127.0.0.1:9202 --max-seconds 30
      onceq mq status
    """


@mq.command()
@click.option(
    "--queue",
    metavar="Q",
    help="Input queue (default claim.in). Its STEM (the name without a trailing .in)"
    " names the others: invoice.in → invoice, invoice, invoice.dlx, invoice.dead.",
)
@click.option("--exchange", metavar="E", help="Direct exchange bound to the queue (default STEM).")
@click.option("--routing-key", metavar="K", help="The key of that binding (default STEM).")
@click.option(
    "--dead-letter-exchange",
    metavar="X",
    help="Where the queue's rejected messages go (default STEM.dlx).",
)
@click.option(
    "--dead-letter-queue",
    metavar="D",
    help="Bound to X with key D; holds the dead letters (default STEM.dead).",
)
@click.option(
    "--flows",
    "flow_file",
    metavar="FILE",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Declare the names of every rabbitmq flow of this flow file instead.",
)
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def topology(
    queue: str | None,
    exchange: str | None,
    routing_key: str | None,
    dead_letter_exchange: str | None,
    dead_letter_queue: str | None,
    flow_file: Path | None,
    as_json: bool,
) -> None:
    """Declare a flow's exchange, queue, dead-letter exchange and dead-letter queue.

    Without options: the claims preset, eai.claim --claim--> claim.in, which
    dead-letters to eai.dlx --claim.dead--> claim.dead. With --queue Q the other
    names come from Q's stem (Q without a trailing ".in"): exchange STEM, routing
    key STEM, dead-letter exchange STEM.dlx, dead-letter queue STEM.dead (also its
    dead-letter key); each option overrides its one name. Without --queue the
    other options override the claims names.

    --flows FILE declares, for every rabbitmq flow of the flow file, the names
    its keys give (queue, exchange, routing_key, dead_letter_exchange,
    dead_letter_queue; the same stem rule), in the broker of the flow's url
    (default EAI_AMQP_URL). The file is checked first, whole (as `onceq check`).

    Idempotent: a second run changes nothing. When the broker already holds one
    of them with other attributes it exits 4 naming the object, and creates
    nothing. A name that cannot be used (empty, over 255 bytes, starting with
    amq.) exits 2 naming the option, before connecting.

    \b
    Example:
      EAI_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2F onceq mq topology
      onceq mq topology --queue invoice.in
      onceq mq topology --flows flows.toml
    """
    import asyncio

    from onceq.amqp.topology import Topology, declare
    from onceq.amqp.url import vhost_of

    if flow_file is not None:
        given = (queue, exchange, routing_key, dead_letter_exchange, dead_letter_queue)
        if any(v is not None for v in given):
            raise UsageError("--flows: the names come from the flow file; give no --queue etc.")
        brokers = _flow_topologies(flow_file)
    else:
        names = Topology.from_options(
            queue, exchange, routing_key, dead_letter_exchange, dead_letter_queue
        ).check()
        brokers = {_url(): [names]}
    done = [(url, asyncio.run(declare(url, *names))) for url, names in brokers.items()]
    if as_json:
        docs = [{"vhost": vhost_of(url), "objects": result} for url, result in done]
        # One broker (the usual case): the one shape every caller reads; several: a list.
        emit_json(docs[0] if len(docs) == 1 else docs)
        return
    for url, result in done:
        created = [k for k, v in result.items() if v == "created"]
        console().print(
            f"topology ready in vhost {vhost_of(url)!r}: {len(result)} objects,"
            f" {len(created)} created{': ' + ', '.join(created) if created else ''}",
            markup=False,  # a vhost name is printed as it is, brackets and all
        )


def _flow_topologies(flow_file: Path) -> dict[str, list[Any]]:
    """{broker URL: the Topology of each rabbitmq flow there}, in the file's order.

    A flow without `url` uses EAI_AMQP_URL (the default broker), as `onceq run` does.
    """
    from onceq.amqp.topology import Topology
    from onceq.amqp.url import amqp_url, setup_logging
    from onceq.cli.run import load_or_exit
    from onceq.flow import RabbitSource

    ff = load_or_exit(flow_file, ())
    setup_logging()
    brokers: dict[str, list[Any]] = {}
    for flow in ff.flows:
        if isinstance(flow.source, RabbitSource):
            url = amqp_url(flow.source.url)
            brokers.setdefault(url, []).append(Topology.for_source(flow.source))
    if not brokers:
        raise UsageError(f"{flow_file}: no rabbitmq flow: nothing to declare")
    return brokers


@mq.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--exchange",
    default="eai.claim",
    show_default=True,
    metavar="E",
    help='Exchange to publish to ("" = the default exchange, routed by queue name).',
)
@click.option("--routing-key", default="claim", show_default=True, metavar="K", help="Routing key.")
@click.option(
    "--id-field",
    default="guid",
    show_default=True,
    metavar="F",
    help="JSON field (a dotted path: invoice.id) whose value becomes message_id.",
)
@click.option(
    "--window",
    default=256,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="Publisher confirms outstanding at once.",
)
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def publish(
    files: tuple[Path, ...],
    exchange: str,
    routing_key: str,
    id_field: str,
    window: int,
    as_json: bool,
) -> None:
    """Publish each FILE as one persistent message to E with key K (eai.claim, claim).

    The body is the file's bytes unchanged; message_id is the JSON's id field
    (guid unless --id-field); content_type application/json. Publisher confirms
    and mandatory are on. Every file is checked first: one unreadable, non-JSON or
    id-less file publishes nothing (exit 5). A returned (no queue bound for the
    key) or nacked message exits 6.

    \b
    Example:
      onceq mq publish claims/*.json --json
      onceq mq publish inv/*.json --exchange invoice --routing-key invoice --id-field invoiceId
    """
    import asyncio

    from onceq.amqp.publisher import check_target, load_messages
    from onceq.amqp.publisher import publish as do_publish

    if not id_field or any(not part for part in id_field.split(".")):
        raise UsageError(f"--id-field: {id_field!r}: not a field name or dotted path")
    check_target(exchange, routing_key)
    url = _url()
    messages = load_messages(list(files), id_field)
    report = asyncio.run(
        do_publish(url, messages, window=window, exchange=exchange, routing_key=routing_key)
    )
    if as_json:
        emit_json(report.as_dict())
        return
    # The claims preset's line is today's, word for word; any other target says message(s).
    noun = (
        "claim(s)"
        if (exchange, routing_key, id_field) == ("eai.claim", "claim", "guid")
        else "message(s)"
    )
    console().print(
        f"published {report.published} {noun} to {exchange or 'the default exchange'},"
        " all confirmed",
        markup=False,
    )


@mq.command()
@click.option(
    "--claim",
    "claim_url",
    help="Claim system base URL: the exercise's claims preset (claim.in, POST"
    " CLAIM/v1/claims, 201 only).",
)
@click.option(
    "--queue",
    metavar="QUEUE",
    help="The queue to consume (default claim.in); with --url, your own flow.",
)
@click.option(
    "--required",
    metavar="A,B",
    help="Comma-separated fields a message must have besides its id (your own flow).",
)
@flow_options(timeout=False)
@click.option(
    "--max-seconds",
    type=Seconds(min=0, min_open=True),
    help="Stop taking messages after N seconds (default: run until SIGTERM/SIGINT).",
)
@click.option(
    "--prefetch",
    default=5,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="Unacked deliveries at most (basic_qos), handled concurrently.",
)
@click.option(
    "--db",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Ledger database (default: EAI_MQ_DB, else ./processed.db); its folder must exist.",
)
@click.option(
    "--timeout",
    default=10.0,
    show_default=True,
    type=Seconds(min=0, min_open=True),
    help="Seconds per HTTP call before it counts as a timeout.",
)
@click.option(
    "--until-empty",
    is_flag=True,
    help="A batch: stop once the queue is drained and nothing is in flight.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def consume(
    claim_url: str | None,
    queue: str | None,
    required: str | None,
    max_seconds: float | None,
    prefetch: int,
    db: Path | None,
    timeout: float,
    until_empty: bool,
    as_json: bool,
    **flags: Any,
) -> None:
    """Consume claim.in, POST each claim to CLAIM/v1/claims, ack after the ledger.

    201 → recorded, then acked. 422 → dead-lettered at once. 503, other
    statuses, connection errors and timeouts → requeued once, then
    dead-lettered. A message_id already in the ledger is acked without a call.

    Your own flow instead of --claim: --url URL (and --queue, --id-field …)
    POSTs each message of --queue to URL: 2xx done, 409 done as a partner
    duplicate, other 4xx dead at once, 5xx/408/425/429 and timeouts requeued
    once, then dead-lettered (see --success … --transient). The id is the
    message_id property, else the --id-field of the body.

    Signals: this consumer runs until it is stopped, so a stop is its normal end:
    SIGTERM, SIGINT or --max-seconds take nothing more, finish the in-flight
    claims, print the summary and exit 0. A second signal stops at once (exit 130;
    the in-flight claims return to claim.in). On a terminal a status line on
    stderr shows the progress; piped, nothing.

    --until-empty makes it a batch: it stops once claim.in has nothing ready and
    every delivery it took is settled (retries included), and exits 0. Like
    every batch that is to finish a queue (dirq consume), it exits 130 (SIGINT) /
    143 (SIGTERM) when a signal stops it first, and 1 when --max-seconds runs out
    first, so that a script knows it did not finish.

    \b
    Example:
      onceq partner claim --port 9202 &
      onceq mq consume --claim http://127.0.0.1:9202 --max-seconds 30 --prefetch 5
      onceq mq consume --claim http://127.0.0.1:9202 --until-empty --json
      onceq mq consume --queue invoice.in --id-field invoiceId \\
          --url http://127.0.0.1:9300/api/invoices --until-empty
    """
    from onceq.amqp.consume import ConsumeOptions, default_db
    from onceq.amqp.consume import consume as run_consume
    from onceq.cli.progress import live_progress

    url = _url()
    flow = _consume_flow(url, claim_url, queue, required, prefetch, timeout, flags)
    opts = ConsumeOptions(
        claim_url=claim_url or "",
        db=db or default_db(),
        prefetch=prefetch,
        max_seconds=max_seconds,
        timeout=timeout,
        until_empty=until_empty,
    )
    qname = flow.source.queue
    with live_progress(qname, "dead") as on_settled:
        result = run_consume(
            url, opts, flow=flow, on_settled=on_settled, on_new_ledger=note_new_ledger
        )
    if as_json:
        emit_json(result.as_dict())
    else:
        _print_consume(result, opts.db, qname)
    if until_empty and not result.drained:
        _unfinished_batch(result.signal, max_seconds, qname)
    if result.aborted:
        # Exit as an interrupted command (128 + the signal that cut the grace short:
        # 130 SIGINT, 143 SIGTERM): the run did not finish its in-flight claims.
        fail(f"interrupted by a second signal; in-flight messages return to {qname}")
        raise SystemExit(128 + (result.abort_signal or signal.SIGINT))


def _consume_flow(
    url: str,
    claim_url: str | None,
    queue: str | None,
    required: str | None,
    prefetch: int,
    timeout: float,
    flags: dict[str, Any],
) -> Any:
    """--claim: the claims preset; --url (and the spec flags): the user's own flow."""
    from onceq.cli.flow_options import build_flow, is_generic
    from onceq.flow import RabbitSource, claims_flow

    if claim_url is not None:
        if is_generic(flags) or queue is not None or required is not None:
            raise UsageError(
                "--claim is the claims preset (claim.in, CLAIM/v1/claims); for your own flow"
                " give --url and --queue instead, not both"
            )
        flow = claims_flow(claim_url, url=url, prefetch=prefetch, timeout=timeout)
        flow.name = flags.get("flow_name") or flow.name
        return flow.validate()
    if not flags.get("http_url"):
        raise UsageError(
            "onceq mq consume: give --claim URL (the claims preset) or --url URL (your own"
            " flow) (see --help)"
        )
    from onceq.amqp.topology import QUEUE

    source = RabbitSource(queue or QUEUE, url=url, prefetch=prefetch)
    return build_flow(
        source,
        {**flags, "required": required},
        rabbit=True,
        timeout=timeout,
        concurrency=prefetch,
    )


def _unfinished_batch(signum: int | None, max_seconds: float | None, queue: str) -> None:
    """Exit as a batch that did not finish: 128 + the signal, or 1 for the deadline."""

    if signum is not None:
        name = signal.Signals(signum).name
        fail(f"stopped by {name} before {queue} was drained; the rest waits in {queue}")
        raise SystemExit(128 + signum)
    within = f" within --max-seconds {max_seconds:g}" if max_seconds is not None else ""
    fail(f"{queue} not drained{within}; the rest waits there")
    raise SystemExit(1)


def _print_consume(result: Any, db: Path, queue: str) -> None:
    # "N unsettled", the JSON's key: deliveries a stop left unacked, back in the queue.
    tail = f", {result.unsettled} unsettled (back to {queue})" if result.unsettled else ""
    if result.drained:
        tail += f"; {queue} drained"
    print_run_summary(result.stats, tail=f"{tail}; ledger {db}")


@mq.command()
@click.option("--queue", metavar="Q", help="Input queue to read (default claim.in).")
@click.option(
    "--dead-letter-queue",
    metavar="D",
    help="Dead-letter queue to read (default claim.dead; with --queue, STEM.dead as"
    " `mq topology --queue` names it).",
)
@click.option("--node", help="RabbitMQ node for rabbitmqctl -n (default: rabbitmqctl's own).")
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def status(
    queue: str | None, dead_letter_queue: str | None, node: str | None, as_json: bool
) -> None:
    """Messages and unacked of a queue and its dead-letter queue, and the memory watermark.

    The queues are claim.in and claim.dead unless --queue / --dead-letter-queue
    name others (--queue invoice.in reads invoice.in and invoice.dead, as
    `mq topology --queue invoice.in` declares them). Reads the broker through
    rabbitmqctl (JSON formatter) for the vhost of EAI_AMQP_URL; needs rabbitmqctl
    on PATH.

    \b
    Example:
      onceq mq status --node rabbit@localhost --json
      onceq mq status --queue invoice.in
    """
    from onceq.amqp.status import status as read_status
    from onceq.amqp.topology import Topology, name_problem
    from onceq.amqp.url import vhost_of

    names = Topology.from_options(queue, dead_letter_queue=dead_letter_queue)
    for option, value in (
        ("--queue", names.queue),
        ("--dead-letter-queue", names.dead_letter_queue),
    ):
        why = name_problem(value, declared=False)
        if why:
            raise UsageError(f"{option}: {value!r}: {why}")
    url = _url()
    doc = read_status(vhost_of(url), node, (names.queue, names.dead_letter_queue))
    if as_json:
        emit_json(doc)
        return
    _print_status(doc)


def _print_status(doc: dict[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(f"vhost {doc['vhost']!r}"))  # a vhost name may hold brackets
    table.add_column("queue")
    table.add_column("messages", justify="right")
    table.add_column("unacked", justify="right")
    for name, q in doc["queues"].items():
        if q is None:
            table.add_row(name, "absent", "-")
        else:
            table.add_row(name, str(q["messages"]), str(q["unacked"]))
    console().print(table)
    console().print(memory_line(doc["memory"]), markup=False)


def _mib(n: int | float) -> str:
    return f"{n / 2**20:.0f} MiB"


def _words(value: Any) -> str:
    """A JSON value as plain words: never Python's repr of a dict or a list."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {_words(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(_words(v) for v in value)
    return str(value)


def memory_line(mem: dict[str, Any]) -> str:
    """The memory alarm in words: 'absolute 512 MiB', 'relative 0.4 of RAM'.

    rabbitmqctl gives the setting as {'absolute': bytes} or {'relative': fraction}
    (a bare fraction on older brokers); printing that dict as Python is not text.
    """
    setting = mem.get("setting")
    if isinstance(setting, int | float) and not isinstance(setting, bool):
        setting = {"relative": setting}
    kind, value = next(iter(setting.items())) if isinstance(setting, dict) and setting else ("", 0)
    if kind == "absolute" and isinstance(value, int | float):
        what = f"absolute {_mib(value)}"
    elif kind == "relative":
        what = f"relative {value} of RAM"
    else:
        what = "unknown" if setting is None else _words(setting)
    figures = [
        f"{label} {_mib(mem[key])}"
        for label, key in (("limit", "limit_bytes"), ("used", "used_bytes"))
        if isinstance(mem.get(key), int | float)
    ]
    alarms = _words(mem.get("alarms") or []) or "none"
    return (
        f"memory high watermark: {what}"
        + (f" ({', '.join(figures)})" if figures else "")
        + f"; alarms: {alarms}"
    )
