"""The console's depth columns come from each flow's source type (`labelled_depths`),
through /api/flows: the page knows no kind of source, so a new kind shows its own
depths without a change to it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from console_support import dead_queue
from onceq import Flow
from onceq._console.server import make_app
from onceq._console.state import ConsoleState
from onceq._sources import registry
from onceq._sources.amqp.depths import labelled as rabbit_labelled
from onceq._sources.nats.depths import labelled as nats_labelled

JS = Path(__file__).parents[2] / "src" / "onceq" / "_console" / "static" / "console.js"


@dataclass(frozen=True)
class TankSource:
    name: str


class TankType(registry.SourceType):
    """A kind the page has never heard of."""

    kind = "tank"
    config = TankSource

    async def status_depths(
        self, flow: Any, api: str | None, now: datetime
    ) -> tuple[dict[str, Any] | None, str | None]:
        return {"kind": "tank", "litres": 7, "sludge": None}, None

    def labelled_depths(self, queue: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            {"key": "litres", "label": "litres", "value": queue["litres"], "unit": None},
            {"key": "sludge", "label": "sludge", "value": queue["sludge"], "unit": None},
        ]


@pytest.fixture
def tank() -> Iterator[TankType]:
    t = registry.register(TankType())
    try:
        yield t
    finally:  # registered for this test only
        registry.unregister("tank")


def flows_doc(state: ConsoleState) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        async with TestClient(TestServer(make_app(state, None), host="127.0.0.1")) as client:
            r = await client.get("/api/flows")
            assert r.status == 200
            doc: dict[str, Any] = await r.json()
            return doc

    return asyncio.run(main())


def test_a_new_kind_of_source_gives_the_page_its_own_depths(tank: TankType, tmp_path: Path) -> None:
    dirq, _root, ledger = dead_queue(tmp_path)
    doc = flows_doc(ConsoleState([dirq, Flow("t", TankSource("t"))], ledger))
    assert doc["flows"]["t"]["depths"] == [
        {"key": "litres", "label": "litres", "value": 7, "unit": None},
        {"key": "sludge", "label": "sludge", "value": None, "unit": None},
    ]
    assert [(d["label"], d["value"], d["unit"]) for d in doc["flows"]["f"]["depths"]] == [
        ("inbox", 0, None),
        ("processing", 0, None),
        ("retry", 0, None),
        ("error", 4, None),
        ("oldest", None, "s"),  # an empty inbox has no oldest file
    ]


def test_the_page_tests_no_kind_of_source() -> None:
    text = JS.read_text()
    for kind in ("dirq", "rabbitmq", "nats", ".kind"):
        assert kind not in text, kind


def test_a_queue_that_cannot_be_read_has_no_depths(tmp_path: Path) -> None:
    dirq, root, ledger = dead_queue(tmp_path)
    (root / "inbox").rename(root / "gone")
    entry = flows_doc(ConsoleState([dirq], ledger))["flows"]["f"]
    assert entry["queue"] is None and entry["queue_error"] and entry["depths"] == []


def test_rabbitmq_labels_sum_its_queue_rows_by_state() -> None:
    doc = {
        "kind": "rabbitmq",
        "queues": [
            {"state": "ready", "name": "a.in", "ready": 3, "unacked": 2},
            {"state": "retry", "name": "a.retry.5s", "ready": 1, "unacked": None},
            {"state": "retry", "name": "a.retry.30s", "ready": 4, "unacked": None},
            {"state": "dead", "name": "a.dead", "ready": None, "unacked": None},  # missing
        ],
    }
    assert [(d["key"], d["label"], d["value"]) for d in rabbit_labelled(doc)] == [
        ("ready", "ready", 3),
        ("in_flight", "in flight", 2),
        ("retry", "retry", 5),
        ("dead", "dead", 0),
    ]


def test_nats_labels_are_the_consumers_own_words() -> None:
    doc = {"kind": "nats", "pending": 5, "ack_pending": 1, "redelivering": 2, "dead": None}
    assert [(d["key"], d["label"], d["value"]) for d in nats_labelled(doc)] == [
        ("pending", "pending", 5),
        ("ack_pending", "ack pending", 1),
        ("redelivering", "redelivering", 2),
        ("dead", "dead", None),  # the dead-letter stream could not be read
    ]
