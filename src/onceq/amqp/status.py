"""Queue depths and the memory watermark, read from the broker with rabbitmqctl.

rabbitmqctl's `--formatter json` output is parsed (never its human tables), so a
wording change between RabbitMQ versions does not silently break the figures.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

from onceq.amqp.topology import DEAD_QUEUE, QUEUE
from onceq.errors import BrokerUnavailable, NotFound

RABBITMQCTL_TIMEOUT = 60


def rabbitmqctl(*args: str, node: str | None = None) -> str:
    """Run rabbitmqctl and return stdout; one-line onceq errors when it cannot run."""
    exe = shutil.which("rabbitmqctl")
    if exe is None:
        raise NotFound(
            "rabbitmqctl: not found on PATH (install the RabbitMQ server/CLI tools,"
            " or run this on the broker's host)"
        )
    cmd = [exe, "-q", *(["-n", node] if node else []), *args]
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=RABBITMQCTL_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        raise BrokerUnavailable(
            f"rabbitmqctl {args[0]}: no answer within {RABBITMQCTL_TIMEOUT}s"
        ) from None
    if done.returncode != 0:
        first = next((ln.strip() for ln in done.stderr.splitlines() if ln.strip()), "")
        raise BrokerUnavailable(f"rabbitmqctl {args[0]} failed: {first or done.returncode}")
    return done.stdout


def queue_depths(
    vhost: str, node: str | None = None, names: Sequence[str] = (QUEUE, DEAD_QUEUE)
) -> dict[str, dict[str, int] | None]:
    """{queue: {messages, unacked}} for each of `names` (default claim.in and claim.dead);
    None for a missing queue."""
    out = rabbitmqctl(
        "list_queues", "-p", vhost, "name", "messages", "messages_unacknowledged",
        "--formatter", "json", node=node,
    )  # fmt: skip
    rows = json.loads(out or "[]")
    found = {
        r["name"]: {"messages": int(r["messages"]), "unacked": int(r["messages_unacknowledged"])}
        for r in rows
    }
    if not found and not vhost_exists(vhost, node):
        # rabbitmqctl lists no queues for a vhost that does not exist, as for an empty
        # one: without this check a typo in the URL would print "absent" and exit 0.
        # Exit 7, as topology, publish and consume exit when the broker refuses a vhost.
        raise BrokerUnavailable(f"vhost {vhost!r} does not exist on the broker")
    return {q: found.get(q) for q in names}


def vhost_exists(vhost: str, node: str | None = None) -> bool:
    out = rabbitmqctl("list_vhosts", "name", "--formatter", "json", node=node)
    return any(r.get("name") == vhost for r in json.loads(out or "[]"))


def memory_watermark(node: str | None = None) -> dict[str, Any]:
    """The memory alarm: its setting ({'absolute': bytes} or {'relative': f}) and limit."""
    doc = json.loads(rabbitmqctl("status", "--formatter", "json", node=node))
    total = doc.get("memory", {}).get("total", {})
    return {
        "setting": doc.get("vm_memory_high_watermark_setting"),
        "limit_bytes": doc.get("vm_memory_high_watermark_limit"),
        "used_bytes": total.get(doc.get("vm_memory_calculation_strategy", "rss")),
        "alarms": doc.get("alarms", []),
    }


def status(
    vhost: str, node: str | None = None, names: Sequence[str] = (QUEUE, DEAD_QUEUE)
) -> dict[str, Any]:
    return {
        "vhost": vhost,
        "queues": queue_depths(vhost, node, names),
        "memory": memory_watermark(node),
    }
