"""`onceq mq …`: the RabbitMQ claims pipeline.

Each command lives in its own module, imported only when it runs (a LazyGroup):
`onceq mq publish` is timed with its start-up, so it must not load what consume,
status, dead and topology need (the runner, the ledger, rich's tables).
"""

from __future__ import annotations

import click

from onceq._cli.lazy import LazyGroup
from onceq._core.logs import setup as setup_logs
from onceq._sources.amqp.url import amqp_url

# name -> (module, command, the first sentence of its help), as onceq._cli.COMMANDS.
LAZY = {
    "consume": (
        "onceq._cli.mq_consume",
        "consume",
        "Consume claim.in, POST each claim to CLAIM/v1/claims, ack after the ledger.",
    ),
    "dead": (
        "onceq._cli.mq_dead",
        "dead",
        "A flow's dead letters: list them in place, show one's body, replay them (one"
        " with a corrected body), purge them.",
    ),
    "publish": (
        "onceq._cli.mq_publish",
        "publish",
        "Publish each FILE as one persistent message to E with key K (eai.claim, claim).",
    ),
    "status": (
        "onceq._cli.mq_status",
        "status",
        "Ready, unacked and consumers of a flow's queues, and the memory watermark.",
    ),
    "topology": (
        "onceq._cli.mq_topology",
        "topology",
        "Declare a flow's exchange, queue, dead-letter exchange and dead-letter queue.",
    ),
}


def cli_url() -> str:
    """The broker URL of every `mq` command, logging set up so no line shows its password."""
    setup_logs()
    return amqp_url()


@click.group(cls=LazyGroup, lazy=LAZY)
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
