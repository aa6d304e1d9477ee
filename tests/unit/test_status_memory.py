"""`mq status`'s memory figures from /api/nodes: which node is shown, every node's alarms."""

from __future__ import annotations

import pytest

from onceq._cli.mq_status import memory_line
from onceq._sources.amqp.depths import QueueDepth
from onceq._sources.amqp.status import memory_of, queue_doc
from onceq.errors import NotFound

MiB = 2**20


def node(name: str, mem: bool = False, disk: bool = False, running: bool = True) -> dict:
    return {"name": name, "running": running, "mem_limit": 1024 * MiB, "mem_used": 100 * MiB,
            "mem_alarm": mem, "disk_free_alarm": disk}  # fmt: skip


def test_one_node_in_words() -> None:
    mem = memory_of([node("rabbit@a")], None)
    assert mem["node"] == "rabbit@a" and mem["alarms"] == [] and mem["unknown"] is None
    assert memory_line(mem) == "memory high watermark: limit 1024 MiB, used 100 MiB; alarms: none"


def test_a_cluster_shows_the_node_in_alarm_and_every_nodes_alarms() -> None:
    nodes = [node("rabbit@a"), node("rabbit@b", disk=True), node("rabbit@c", mem=True)]
    mem = memory_of(nodes, None)
    assert mem["node"] == "rabbit@c"  # the one a reader needs to see
    assert mem["alarms"] == ["disk on rabbit@b", "memory on rabbit@c"]
    assert memory_line(mem) == (
        "memory high watermark: limit 1024 MiB, used 100 MiB on rabbit@c (of 3 nodes;"
        " --node picks another); alarms: disk on rabbit@b, memory on rabbit@c"
    )
    assert memory_of(nodes, "rabbit@a")["node"] == "rabbit@a"


def test_a_stopped_node_is_not_the_default() -> None:
    stopped = {"name": "rabbit@a", "running": False}
    assert memory_of([stopped, node("rabbit@b")], None)["node"] == "rabbit@b"
    assert memory_of([stopped, node("rabbit@b")], "rabbit@a")["limit_bytes"] is None


def test_an_unknown_node_is_not_found_naming_the_real_ones() -> None:
    with pytest.raises(NotFound, match=r"rabbit@x.*rabbit@a, rabbit@b"):
        memory_of([node("rabbit@a"), node("rabbit@b")], "rabbit@x")


def test_without_the_api_everything_is_unknown_and_says_why() -> None:
    mem = memory_of(None, "rabbit@a")  # --node cannot be checked without the API
    assert mem["limit_bytes"] is None and mem["alarms"] is None
    assert memory_line(mem) == "memory high watermark: unknown (needs the management API)"


def test_messages_is_ready_plus_unacked_or_null() -> None:
    assert queue_doc(QueueDepth(ready=4, consumers=1, unacked=2)) == {
        "messages": 6, "ready": 4, "unacked": 2, "consumers": 1,
    }  # fmt: skip
    assert queue_doc(QueueDepth(ready=4, consumers=1, unacked=None))["messages"] is None  # type: ignore[index]
    assert queue_doc(None) is None
