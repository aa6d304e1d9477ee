"""`onceq mq topology`: declare a flow's exchange, queues and retry queues."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click

from onceq._cli.broker_options import names_options, setup_options
from onceq._cli.mq import cli_url
from onceq._cli.output import console, emit_json
from onceq._cli.retry_options import retry_from_values, retry_options
from onceq._cli.run import load_or_exit
from onceq._core.logs import setup as setup_logs
from onceq._core.retry import RetryPolicy
from onceq._sources.amqp.plugin import rabbit_of
from onceq._sources.amqp.topology import Topology
from onceq._sources.amqp.topology_declare import declare
from onceq._sources.amqp.url import amqp_url, vhost_of
from onceq.errors import UsageError


@click.command()
@names_options(
    (
        "--queue",
        "Q",
        "Input queue (default claim.in). Its STEM (the name without a trailing .in)"
        " names the others: invoice.in → invoice, invoice, invoice.dlx, invoice.dead.",
    ),
    ("--exchange", "E", "Direct exchange bound to the queue (default STEM)."),
    ("--routing-key", "K", "The key of that binding (default STEM)."),
    ("--dead-letter-exchange", "X", "Where the queue's rejected messages go (default STEM.dlx)."),
    (
        "--dead-letter-queue",
        "D",
        "Bound to X with key D; holds the dead letters (default STEM.dead).",
    ),
)
@click.option(
    "--queue-type",
    type=click.Choice(["classic", "quorum"]),
    help="classic (default: the exercise's objects) or quorum: the work queue, its"
    " dead-letter queue and its retry queues replicated (docs/mq.md, Quorum queues).",
)
@setup_options(
    flows_help="Declare the names of every rabbitmq flow of this flow file instead.",
    between=(retry_options(breaker=False),),
)
def topology(
    queue: str | None,
    exchange: str | None,
    routing_key: str | None,
    dead_letter_exchange: str | None,
    dead_letter_queue: str | None,
    queue_type: str | None,
    flow_file: Path | None,
    as_json: bool,
    **retry_flags: Any,
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

    The retry queues: one per delay of the consumer's retry policy, STEM.retry.5s,
    STEM.retry.30s, STEM.retry.2m, STEM.retry.10m for the default policy (claims:
    claim.retry.5s …), each holding a copy for its TTL, then giving it back to Q.
    Declare the policy the consumer will run: --retry-delays 1s,10s for other
    delays, --retry exercise (or --retry-delays none) for none, which is exactly
    the exercise's objects. With --flows, each flow's own retry policy.

    --queue-type quorum declares the work queue, the dead-letter queue and the
    retry queues as quorum queues (RabbitMQ 3.10+): replicated, with
    at-least-once dead-lettering and a delivery limit high enough that onceq's
    own attempt count decides (x-delivery-limit 1000000; why: docs/mq.md). A
    flow file says queue_type = "quorum" in the flow's table. A queue's type
    cannot change once declared: the broker refuses (exit 4).

    Idempotent: a second run changes nothing. When the broker already holds one
    of them with other attributes it exits 4 naming the object, and creates
    nothing. A name that cannot be used (empty, over 255 bytes, starting with
    amq.) exits 2 naming the option, before connecting.

    \b
    Example:
      EAI_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2F onceq mq topology
      onceq mq topology --queue invoice.in
      onceq mq topology --queue invoice.in --queue-type quorum
      onceq mq topology --retry exercise
      onceq mq topology --retry-delays 1s,10s,1m
      onceq mq topology --flows flows.toml
    """
    policy = retry_from_values(retry_flags)
    if flow_file is not None:
        given = (queue, exchange, routing_key, dead_letter_exchange, dead_letter_queue)
        if any(v is not None for v in given):
            raise UsageError("--flows: the names come from the flow file; give no --queue etc.")
        if policy is not None:
            raise UsageError("--flows: each flow's retry policy comes from the flow file")
        if queue_type is not None:
            raise UsageError("--flows: each flow's queue_type comes from the flow file")
        brokers = _flow_topologies(flow_file)
    else:
        delays = (policy or RetryPolicy()).delays
        names = Topology.from_options(
            queue,
            exchange,
            routing_key,
            dead_letter_exchange,
            dead_letter_queue,
            delays,
            queue_type or "classic",
        ).check()
        brokers = {cli_url(): [names]}
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

    ff = load_or_exit(flow_file, ())
    setup_logs()
    brokers: dict[str, list[Any]] = {}
    for flow in ff.flows:
        source = rabbit_of(flow.source)
        if source is not None:
            url = amqp_url(source.url)
            brokers.setdefault(url, []).append(Topology.for_flow(flow))
    if not brokers:
        raise UsageError(f"{flow_file}: no rabbitmq flow: nothing to declare")
    return brokers
