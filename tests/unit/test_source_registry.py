"""A source type registered from a test reaches every generic layer through the registry.

The generic layers (flows, ops) never test a source's class: a kind they have never
heard of, registered here, is parsed from a flow file, validated, named in mistakes,
read for `onceq status` and for /metrics, and refused by name when mistyped.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from onceq._core.keys import Mistakes, get
from onceq._core.message import MessageSpec
from onceq._core.transport import Delivery
from onceq._flows.file import FlowFileError, load_flows
from onceq._flows.flow import Flow
from onceq._flows.runner import run
from onceq._ledger.sqlite import Ledger
from onceq._ops import status
from onceq._ops.metrics_queues import reader_for
from onceq._sources import registry
from onceq._sources.feed import Feed
from onceq._sources.memory import MemoryTransport
from onceq._sources.registry import SourceType


@dataclass(frozen=True)
class TestQ:
    items: tuple[str, ...]
    __test__ = False  # not a test class


class Reader:
    def __init__(self, n: int) -> None:
        self.n = n

    def messages(self) -> dict[str, int]:
        return {"ready": self.n}


class TestQType(SourceType):
    __test__ = False
    kind = "testq"
    config = TestQ
    file_keys = frozenset({"items"})

    def validate(self, source: TestQ, flow: Any, where: str) -> str | None:
        return None if source.items else "a testq source needs items"

    def from_table(self, table: dict[str, Any], where: str, base: Path, m: Mistakes) -> Any:
        items = get(table, "items", list, m, where, required=True)
        return TestQ(tuple(items)) if items is not None else None

    def depth_reader(self, flow: Any, transport: Any) -> Reader:
        return Reader(len(flow.source.items))

    def open(self, flow: Any, until_empty: bool) -> Feed:
        # its bodies as a broker would hand them out: the run drives it as any source
        deliveries = [
            Delivery(body=b.encode(), ref=f"testq-{i}") for i, b in enumerate(flow.source.items)
        ]
        return Feed(MemoryTransport(deliveries))

    async def status_depths(
        self, flow: Any, api: str | None, now: datetime
    ) -> tuple[dict[str, Any] | None, str | None]:
        return {"kind": "testq", "ready": len(flow.source.items)}, None


@pytest.fixture(autouse=True)
def testq() -> Any:
    t = registry.register(TestQType())
    yield t
    registry.unregister("testq")


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "flows.toml"
    p.write_text(text)
    return p


def test_a_flow_file_names_the_registered_kind(tmp_path: Path) -> None:
    path = write(tmp_path, '[flows.a]\nsource = "testq"\nitems = ["x", "y"]\nid_field = "id"\n')
    (flow,) = load_flows(path).flows
    assert flow.source == TestQ(("x", "y"))
    assert flow.kind == "testq"
    assert flow.validate() is flow


def test_its_mistakes_read_like_every_other_source(tmp_path: Path) -> None:
    path = write(tmp_path, '[flows.a]\nsource = "testq"\nqueue = "q"\n')
    with pytest.raises(FlowFileError) as err:
        load_flows(path)
    text = str(err.value)
    assert "line 3: flows.a.queue: is for a rabbitmq source, not a testq one" in text
    assert "flows.a.items: missing: it is required" in text


def test_a_mistyped_kind_lists_every_registered_one(tmp_path: Path) -> None:
    path = write(tmp_path, '[flows.a]\nsource = "testqq"\n')
    with pytest.raises(FlowFileError) as err:
        load_flows(path)
    assert 'flows.a.source: must be "dirq", "rabbitmq", "nats" or "testq", not \'testqq\'' in str(
        err.value
    )


def test_validate_asks_the_type() -> None:
    with pytest.raises(Exception, match="flow 'a': a testq source needs items"):
        Flow("a", TestQ(())).validate()


def test_status_and_metrics_read_its_depths() -> None:
    flow = Flow("a", TestQ(("x", "y", "z")))
    doc = status.gather([flow], None, now=datetime.now(UTC))
    entry = doc["flows"]["a"]
    assert entry["source"] == "testq"
    assert entry["queue"] == {"kind": "testq", "ready": 3}
    reader = reader_for(flow, None)
    assert reader is not None and reader.messages() == {"ready": 3}


def test_the_builtin_kinds_are_found_by_their_objects() -> None:
    from onceq._sources.amqp.plugin import RabbitSource
    from onceq._sources.dirq.plugin import DirSource
    from onceq._sources.memory import MemoryTransport

    assert registry.of(DirSource(Path("q"))) is registry.named("dirq")
    assert registry.of(RabbitSource("q")) is registry.named("rabbitmq")
    assert registry.of(MemoryTransport()) is registry.named("transport")
    assert registry.of(object()) is None
    assert registry.kinds() == ["dirq", "rabbitmq", "nats", "testq"]


def test_a_flow_of_the_registered_kind_runs_once_per_id(tmp_path: Path) -> None:
    """The one run path opens it through its type: the ledger refuses the second copy."""
    calls: list[str] = []
    bodies = ['{"id": "a"}', '{"id": "b"}', '{"id": "a"}']
    flow = Flow(
        "t", TestQ(tuple(bodies)), MessageSpec(id_field="id"), lambda doc: calls.append(doc["id"])
    )
    stats = run(flow, ledger=tmp_path / "ledger.db", until_empty=True)["t"]
    assert (stats.processed, stats.duplicates) == (2, 1)
    assert sorted(calls) == ["a", "b"]
    with Ledger(tmp_path / "ledger.db", flow="t") as ledger:
        assert ledger.processed_ref("a") is not None and ledger.processed_ref("b") is not None


def test_unregister_forgets_the_types_fault_points() -> None:
    """A test's type declares a point; once unregistered, the name is free again (another
    type may declare it) and no longer counts as a declared point."""
    from onceq._core import faults

    class Pointed(TestQType):
        kind = "pointed"
        fault_points = {"after-pointed-take": "a test's own window"}  # noqa: RUF012

    registry.register(Pointed())
    try:
        assert faults.points()["after-pointed-take"] == "pointed"
    finally:
        registry.unregister("pointed")
    assert "after-pointed-take" not in faults.points()
    faults.declare("other", {"after-pointed-take": "now another owner's"})
    faults.forget("other")
    assert "after-pointed-take" not in faults.points()
    with pytest.raises(ValueError, match="engine"):
        faults.forget("engine")
    assert "before-commit" in faults.points()
