"""`onceq mq status`: a flow's queue depths and the broker's memory alarm, in words."""

from __future__ import annotations

import asyncio
from typing import Any

import click

from onceq._cli.broker_options import JSON_HELP
from onceq._cli.mq import cli_url
from onceq._cli.output import console, emit_json
from onceq._cli.retry_options import retry_from_values, retry_options
from onceq._core.retry import RetryPolicy
from onceq._sources.amqp.depths import management_api, topology_queues
from onceq._sources.amqp.status import read_status
from onceq._sources.amqp.topology import Topology, name_problem
from onceq.errors import UsageError


@click.command()
@click.option("--queue", metavar="Q", help="Input queue to read (default claim.in).")
@click.option(
    "--dead-letter-queue",
    metavar="D",
    help="Dead-letter queue to read (default claim.dead; with --queue, STEM.dead as"
    " `mq topology --queue` names it).",
)
@retry_options(breaker=False)
@click.option(
    "--management-url",
    metavar="URL",
    help="The RabbitMQ management API (where unacked and memory come from), e.g."
    " http://mgmt:15672, with its own user:password if it needs another login; 'off'"
    " to not ask it. Default: EAI_RABBITMQ_API, else the broker's host on port 15672"
    " (https 15671 for amqps://) with the broker URL's login.",
)
@click.option(
    "--node",
    metavar="NODE",
    help="The cluster node whose memory is shown (a name from the management API, e.g."
    " rabbit@mq1; default: a node in alarm, else the first). It was rabbitmqctl's -n"
    " before; mq status no longer runs rabbitmqctl.",
)
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def status(
    queue: str | None,
    dead_letter_queue: str | None,
    management_url: str | None,
    node: str | None,
    as_json: bool,
    **retry_flags: Any,
) -> None:
    """Ready, unacked and consumers of a flow's queues, and the memory watermark.

    The queues are the ones `mq topology` declares with the same options: the
    work queue (claim.in, or --queue Q), its retry tiers (STEM.retry.5s ... for
    the default retry policy; --retry-delays / --retry as for mq topology) and
    the dead-letter queue (claim.dead, STEM.dead, or --dead-letter-queue D), in
    the vhost of EAI_AMQP_URL.

    Read over the network from wherever onceq runs (no rabbitmqctl): ready
    messages and consumers with AMQP passive declares; unacked and the memory
    watermark from the RabbitMQ management API (the rabbitmq_management plugin),
    which lag up to 5 s (the broker's statistics interval). Without the API
    (off, unreachable, login refused) they show as "-" / unknown (null in JSON,
    with "management" saying why) and the command still exits 0. A vhost that
    does not exist, or a broker that cannot be reached: exit 7, one line.

    \b
    Example:
      onceq mq status --json
      onceq mq status --queue invoice.in --retry-delays 1m,10m
      EAI_RABBITMQ_API=http://monitor:secret@mq1:15672 onceq mq status
    """
    policy = retry_from_values(retry_flags)
    names = Topology.from_options(
        queue,
        dead_letter_queue=dead_letter_queue,
        retry_delays=(policy or RetryPolicy()).delays,
    )
    for option, value in (
        ("--queue", names.queue),
        ("--dead-letter-queue", names.dead_letter_queue),
    ):
        why = name_problem(value, declared=False)
        if why:
            raise UsageError(f"{option}: {value!r}: {why}")
    url = cli_url()
    api = management_api(url, management_url)
    doc = asyncio.run(read_status(url, topology_queues(names), api, node))
    if as_json:
        emit_json(doc)
        return
    _print_status(doc)


def _cell(value: int | None) -> str:
    return "-" if value is None else str(value)


def _print_status(doc: dict[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(f"vhost {doc['vhost']!r}"))  # a vhost name may hold brackets
    table.add_column("queue")
    table.add_column("holds")
    for column in ("ready", "unacked", "consumers"):
        table.add_column(column, justify="right")
    for name, q in doc["queues"].items():
        state = doc["states"].get(name, "")
        if q is None:
            table.add_row(Text(name), state, "absent", "-", "-")
        else:
            table.add_row(
                Text(name), state, str(q["ready"]), _cell(q["unacked"]), str(q["consumers"])
            )
    console().print(table)
    console().print(memory_line(doc["memory"]), markup=False)
    api = doc["management"]
    if not api["available"]:
        where = f"management API {api['url']}" if api["url"] else "management API"
        console().print(
            f"{where}: {api['error'] or 'not answering'} (unacked and memory need it)",
            markup=False,
        )


def _mib(n: int | float) -> str:
    return f"{n / 2**20:.0f} MiB"


def _words(value: Any) -> str:
    """A JSON value as plain words: never Python's repr of a dict or a list."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {_words(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(_words(v) for v in value)
    return str(value)


def memory_line(mem: dict[str, Any]) -> str:
    """The memory alarm in words: 'absolute 512 MiB', 'relative 0.4 of RAM', or (from the
    management API, which gives no setting) 'limit 9642 MiB, used 130 MiB'.

    A setting comes as {'absolute': bytes} or {'relative': fraction} (a bare fraction
    from older brokers); printing that dict as Python is not text.
    """
    if mem.get("unknown"):
        return f"memory high watermark: unknown ({mem['unknown']})"
    setting = mem.get("setting")
    if isinstance(setting, int | float) and not isinstance(setting, bool):
        setting = {"relative": setting}
    kind, value = next(iter(setting.items())) if isinstance(setting, dict) and setting else ("", 0)
    if kind == "absolute" and isinstance(value, int | float):
        what = f"absolute {_mib(value)}"
    elif kind == "relative":
        what = f"relative {value} of RAM"
    else:
        what = "" if setting is None else _words(setting)
    figures = [
        f"{label} {_mib(mem[key])}"
        for label, key in (("limit", "limit_bytes"), ("used", "used_bytes"))
        if isinstance(mem.get(key), int | float)
    ]
    if what:
        what += f" ({', '.join(figures)})" if figures else ""
    else:
        what = ", ".join(figures) or "unknown"
    if (mem.get("nodes") or 1) > 1 and mem.get("node"):
        what += f" on {mem['node']} (of {mem['nodes']} nodes; --node picks another)"
    alarms = _words(mem.get("alarms") or []) or "none"
    return f"memory high watermark: {what}; alarms: {alarms}"
