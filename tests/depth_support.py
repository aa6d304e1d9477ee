"""Helpers of the depth tests: the broker's own figures, and a consumer that holds."""

from __future__ import annotations

import json

import pika

from mq_support import ctl, vhost, wait_for
from onceq._sources.amqp.depths import QueueDepth


def truth(url: str) -> dict[str, QueueDepth]:
    """The broker's own figures (rabbitmqctl asks every queue process: live)."""
    out = ctl(
        "list_queues", "-p", vhost(url), "name", "messages_ready", "messages_unacknowledged",
        "consumers", "--formatter", "json",
    )  # fmt: skip
    return {
        r["name"]: QueueDepth(
            ready=int(r["messages_ready"]),
            consumers=int(r["consumers"]),
            unacked=int(r["messages_unacknowledged"]),
        )
        for r in json.loads(out or "[]")
    }


class Holder:
    """A pika consumer of the test's own that takes deliveries and never acks them."""

    def __init__(self, url: str, queue: str, prefetch: int) -> None:
        self.conn = pika.BlockingConnection(pika.URLParameters(url))
        self.ch = self.conn.channel()
        self.ch.basic_qos(prefetch_count=prefetch)
        self.held: list[int] = []
        self.ch.basic_consume(queue, lambda _c, m, _p, _b: self.held.append(m.delivery_tag))

    def take(self, n: int) -> None:
        wait_for(lambda: self.conn.process_data_events(0.05) or len(self.held) >= n, 10)

    def close(self) -> None:
        self.conn.close()
