"""`onceq mq status`: a flow's queue depths and the broker's memory alarm, in words."""

from __future__ import annotations

from typing import Any

import click

from onceq.cli.mq_consume import cli_url
from onceq.cli.output import console, emit_json
from onceq.errors import UsageError

JSON_HELP = "Print the outcome as JSON."


@click.command()
@click.option("--queue", metavar="Q", help="Input queue to read (default claim.in).")
@click.option(
    "--dead-letter-queue",
    metavar="D",
    help="Dead-letter queue to read (default claim.dead; with --queue, STEM.dead as"
    " `mq topology --queue` names it).",
)
@click.option("--node", help="RabbitMQ node for rabbitmqctl -n (default: rabbitmqctl's own).")
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def status(
    queue: str | None, dead_letter_queue: str | None, node: str | None, as_json: bool
) -> None:
    """Messages and unacked of a queue and its dead-letter queue, and the memory watermark.

    The queues are claim.in and claim.dead unless --queue / --dead-letter-queue
    name others (--queue invoice.in reads invoice.in and invoice.dead, as
    `mq topology --queue invoice.in` declares them). Reads the broker through
    rabbitmqctl (JSON formatter) for the vhost of EAI_AMQP_URL; needs rabbitmqctl
    on PATH.

    \b
    Example:
      onceq mq status --node rabbit@localhost --json
      onceq mq status --queue invoice.in
    """
    from onceq.amqp.status import status as read_status
    from onceq.amqp.topology import Topology, name_problem
    from onceq.amqp.url import vhost_of

    names = Topology.from_options(queue, dead_letter_queue=dead_letter_queue)
    for option, value in (
        ("--queue", names.queue),
        ("--dead-letter-queue", names.dead_letter_queue),
    ):
        why = name_problem(value, declared=False)
        if why:
            raise UsageError(f"{option}: {value!r}: {why}")
    url = cli_url()
    doc = read_status(vhost_of(url), node, (names.queue, names.dead_letter_queue))
    if as_json:
        emit_json(doc)
        return
    _print_status(doc)


def _print_status(doc: dict[str, Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(f"vhost {doc['vhost']!r}"))  # a vhost name may hold brackets
    table.add_column("queue")
    table.add_column("messages", justify="right")
    table.add_column("unacked", justify="right")
    for name, q in doc["queues"].items():
        if q is None:
            table.add_row(name, "absent", "-")
        else:
            table.add_row(name, str(q["messages"]), str(q["unacked"]))
    console().print(table)
    console().print(memory_line(doc["memory"]), markup=False)


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
    """The memory alarm in words: 'absolute 512 MiB', 'relative 0.4 of RAM'.

    rabbitmqctl gives the setting as {'absolute': bytes} or {'relative': fraction}
    (a bare fraction on older brokers); printing that dict as Python is not text.
    """
    setting = mem.get("setting")
    if isinstance(setting, int | float) and not isinstance(setting, bool):
        setting = {"relative": setting}
    kind, value = next(iter(setting.items())) if isinstance(setting, dict) and setting else ("", 0)
    if kind == "absolute" and isinstance(value, int | float):
        what = f"absolute {_mib(value)}"
    elif kind == "relative":
        what = f"relative {value} of RAM"
    else:
        what = "unknown" if setting is None else _words(setting)
    figures = [
        f"{label} {_mib(mem[key])}"
        for label, key in (("limit", "limit_bytes"), ("used", "used_bytes"))
        if isinstance(mem.get(key), int | float)
    ]
    alarms = _words(mem.get("alarms") or []) or "none"
    return (
        f"memory high watermark: {what}"
        + (f" ({', '.join(figures)})" if figures else "")
        + f"; alarms: {alarms}"
    )
