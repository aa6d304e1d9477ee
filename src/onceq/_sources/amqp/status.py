"""What `onceq mq status` reports: a flow's queue depths and the broker's memory alarm.

Read over the network (onceq._sources.amqp.depths), never with rabbitmqctl: rabbitmqctl works
only on the broker's own host, so from anywhere else `mq status` showed nothing.
Ready messages and consumers come from AMQP and are always there; unacked and the
memory watermark come from the management HTTP API and are None ("unknown") where it
is off or refuses — the report then says why (`management`), and still exits 0:
knowing the depths without the unacked beats knowing nothing.

The JSON keeps the shape of the rabbitmqctl days where a key still means what it
meant: a queue's `messages` is still ready + unacked (rabbitmqctl's `messages`), so
it is null when unacked is unknown; `ready` and `consumers` are new.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from onceq._sources.amqp.depths import (
    ManagementApi,
    QueueDepth,
    flow_queues,
    management_api,
    read_depths,
)
from onceq._sources.amqp.url import amqp_url, vhost_of
from onceq.errors import NotFound

NEEDS_API = "needs the management API"
TURNED_OFF = "turned off (--management-url / EAI_RABBITMQ_API off)"
# The resource alarms /api/nodes reports, by the word the memory line uses.
ALARMS = {"memory": "mem_alarm", "disk": "disk_free_alarm"}


def queue_doc(depth: QueueDepth | None) -> dict[str, int | None] | None:
    if depth is None:
        return None
    total = None if depth.unacked is None else depth.ready + depth.unacked
    return {
        "messages": total,
        "ready": depth.ready,
        "unacked": depth.unacked,
        "consumers": depth.consumers,
    }


def memory_of(nodes: list[dict[str, Any]] | None, node: str | None) -> dict[str, Any]:
    """The memory figures of one node of /api/nodes (`node`, else one with an alarm, else
    the first); every figure None, and why, without the API.

    The alarms are every node's: a memory alarm on any node blocks publishers on all.
    """
    if nodes is None:
        return {
            "node": None,
            "setting": None,
            "limit_bytes": None,
            "used_bytes": None,
            "alarms": None,
            "nodes": None,
            "unknown": NEEDS_API,
        }
    names = [str(n.get("name")) for n in nodes]
    if node is not None and node not in names:
        raise NotFound(
            f"--node {node!r}: not a node of this broker (nodes: {', '.join(names) or 'none'})"
        )
    alarms = []
    for n in nodes:
        where = f" on {n.get('name')}" if len(nodes) > 1 else ""
        alarms += [f"{word}{where}" for word, key in ALARMS.items() if n.get(key) is True]
    if node is not None:
        chosen = nodes[names.index(node)]
    else:  # a node in alarm first: that is the one the reader needs to see
        running = [n for n in nodes if n.get("running") is not False]
        chosen = next((n for n in running if n.get("mem_alarm")), (running or nodes or [{}])[0])
    return {
        "node": chosen.get("name"),
        # The watermark's setting (relative / absolute) is not in the API; the limit it
        # gives is the setting worked out in bytes.
        "setting": None,
        "limit_bytes": _int(chosen.get("mem_limit")),
        "used_bytes": _int(chosen.get("mem_used")),
        "alarms": alarms,
        "nodes": len(nodes),
        "unknown": None,
    }


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def read_status(
    amqp_url: str,
    queues: Sequence[tuple[str, str]],
    api: ManagementApi | None,
    node: str | None = None,
) -> dict[str, Any]:
    """The report of `mq status` for `queues` [(state, name)]; BrokerUnavailable (exit 7)
    when the broker or the vhost is not there."""
    depths = await read_depths(amqp_url, [name for _, name in queues], api=api)
    nodes = None
    if api is not None and api.available is not False:
        # Not after a failure on this read: a second 2-s timeout would say nothing new.
        async with api.session() as session:
            nodes = await api.nodes(session)
    management = (
        api.as_dict() if api is not None else {"url": None, "available": False, "error": TURNED_OFF}
    )
    return {
        "vhost": vhost_of(amqp_url),
        "queues": {name: queue_doc(depths.get(name)) for _, name in queues},
        "states": {name: state for state, name in queues},
        "memory": memory_of(nodes, node),
        "management": management,
    }


async def flow_depths(flow: Any, api: str | None) -> dict[str, Any]:
    url = amqp_url(flow.source.url)
    names = flow_queues(flow)
    depths = await read_depths(url, [q for _, q in names], api=management_api(url, api))
    queues = []
    for state, name in names:
        d = depths.get(name)
        queues.append(
            {
                "state": state,
                "name": name,
                "exists": d is not None,
                "ready": None if d is None else d.ready,
                "unacked": None if d is None else d.unacked,
                "consumers": None if d is None else d.consumers,
            }
        )
    return {"kind": "rabbitmq", "queues": queues}
