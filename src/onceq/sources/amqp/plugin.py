"""RabbitMQ as a source type (onceq.sources.registry).

Placeholder until the source-type registry's own version lands: only what the run
path asks (`open`, `problem`) is here.
"""

from __future__ import annotations

from typing import Any

from onceq.sources.amqp.open import RabbitFeed
from onceq.sources.registry import SourceType


class RabbitType(SourceType):
    kind = "rabbitmq"

    def accepts(self, source: object) -> bool:
        return type(source).__name__ == "RabbitSource"  # placeholder: the registry's config

    def problem(self, flow: Any, transport: Any) -> str | None:
        return None if transport.connected else "broker connection lost"

    def open(self, flow: Any, until_empty: bool) -> RabbitFeed:
        return RabbitFeed(flow, until_empty)


RABBITMQ = RabbitType()
