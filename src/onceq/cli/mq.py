"""`onceq mq …` and `onceq partner …`: the RabbitMQ claims pipeline."""

from __future__ import annotations

import click


@click.group()
def mq() -> None:
    """RabbitMQ: topology, confirming publisher, manual-ack consumer with DLQ.

    Every command reads EAI_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/%2F).
    """


@click.group()
def partner() -> None:
    """Stub partner systems for demos, tests and benchmarks."""
