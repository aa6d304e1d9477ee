"""`onceq nats …`: a NATS JetStream stream, its durable pull consumer and its dead letters.

Each command lives in its own module, imported only when it runs (a LazyGroup), so
`onceq nats publish` does not load what consume needs (the runner, the ledger).
"""

from __future__ import annotations

import click

from onceq._cli.lazy import LazyGroup
from onceq._core.logs import setup as setup_logs
from onceq._sources.nats.names import nats_url

# name -> (module, command, the first sentence of its help), as onceq._cli.COMMANDS.
LAZY = {
    "consume": (
        "onceq._cli.nats_consume",
        "consume",
        "Consume a durable pull consumer's messages into your flow; ack after the ledger.",
    ),
    "dead": (
        "onceq._cli.nats_dead",
        "dead",
        "A flow's dead letters: list them in place, replay them, purge them.",
    ),
    "publish": (
        "onceq._cli.nats_publish",
        "publish",
        "Publish each FILE as one message to SUBJECT, its id as Nats-Msg-Id, each stored.",
    ),
    "setup": (
        "onceq._cli.nats_setup",
        "setup",
        "Create, or check, a flow's stream, dead-letter stream and durable pull consumer.",
    ),
}


def cli_url() -> str:
    """The server URL of every `nats` command, logging set up so no line shows its password."""
    setup_logs()
    return nats_url()


@click.group(cls=LazyGroup, lazy=LAZY)
def nats() -> None:
    """NATS JetStream: stream and consumer setup, de-duplicating publisher, pull consumer.

    Every command reads ONCEQ_NATS_URL (default nats://127.0.0.1:4222). Passwords are
    never printed.

    \b
    Example:
      onceq nats setup --stream INVOICES --subject invoices --durable worker
      onceq nats publish invoices/*.json --subject invoices --id-field invoiceId
      onceq nats consume --stream INVOICES --durable worker --id-field invoiceId \\
          --url http://127.0.0.1:9300/api/invoices --until-empty
    """
