"""Which flow an `onceq mq dead` command is about: its names, broker, ledger, filter.

The options every `mq dead` command shares (`target_options`: --queue … or --flows
FILE --flow NAME, --db), what they name (`resolve` → `Target`, every mistake refused
before connecting), its ledger (never created), and a change's filter
(`change_filters`: --all | --id | --reason).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from onceq._cli.broker_options import JSON_HELP
from onceq._cli.db_option import db_option
from onceq._cli.flow_options import flow_name_option
from onceq._cli.mq import cli_url
from onceq._cli.run import load_or_exit
from onceq._core.logs import setup as setup_logs
from onceq._ledger.target import Target as LedgerTarget
from onceq._ledger.target import describe
from onceq._ledger.target import open_ledger as open_target
from onceq._sources.amqp.consume import default_db
from onceq._sources.amqp.dead_letter import Selection
from onceq._sources.amqp.plugin import rabbit_of
from onceq._sources.amqp.topology import Topology
from onceq._sources.amqp.url import amqp_url
from onceq.errors import NotFound, UsageError


@dataclass(frozen=True)
class Target:
    """Which flow: its names, the broker, the ledger file, its scope and id rule."""

    url: str
    topology: Any
    db: LedgerTarget  # a path or a postgresql:// URL (never printed as it is: `describe`)
    flow: str
    id_field: str | None


def target_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The options every `mq dead` command shares: which flow, which ledger."""
    opts: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
        click.option(
            "--queue",
            metavar="Q",
            help="The flow's work queue (default claim.in); the other names from its stem,"
            " as `onceq mq topology --queue Q` names them.",
        ),
        click.option("--exchange", metavar="E", help="Work exchange (default STEM)."),
        click.option("--routing-key", metavar="K", help="Work routing key (default STEM)."),
        click.option("--dead-letter-exchange", metavar="X", help="Default STEM.dlx."),
        click.option(
            "--dead-letter-queue", metavar="D", help="The dead letters' queue (default STEM.dead)."
        ),
        click.option(
            "--id-field",
            metavar="PATH",
            help="With --queue: the body's id field when a message has no message_id"
            " property (default msg_id; the claims preset: guid).",
        ),
        click.option(
            "--flows",
            "flow_file",
            metavar="FILE",
            type=click.Path(path_type=Path, dir_okay=False),
            help="Take the names, the id rule and the ledger from this flow file's --flow.",
        ),
        flow_name_option("The flow's name in the ledger (with --flows: which flow of FILE)."),
        db_option(
            "Ledger: a path or a postgresql:// URL (default: EAI_MQ_DB, else ./processed.db;"
            " with --flows, the file's ledger)."
        ),
        click.option("--json", "as_json", is_flag=True, help=JSON_HELP),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def resolve(values: dict[str, Any]) -> Target:
    """The Target the options name; every mistake refused before connecting (exit 2)."""

    names = ("queue", "exchange", "routing_key", "dead_letter_exchange", "dead_letter_queue")
    given = {k: values.pop(k) for k in names}
    id_field = values.pop("id_field")
    flow_file = values.pop("flow_file")
    flow_name = values.pop("flow_name") or "default"
    db = values.pop("db")
    if flow_file is not None:
        if any(v is not None for v in given.values()) or id_field is not None:
            raise UsageError("--flows: the names come from the flow file; give no --queue etc.")
        return _from_flow_file(flow_file, flow_name, db)
    if id_field is not None and given["queue"] is None:
        raise UsageError("--id-field: only with --queue (the claims preset's id is guid)")
    topology = Topology.from_options(*given.values()).check()
    if given["queue"] is None:
        id_field = "guid"  # the claims preset (onceq._exercise.presets.CLAIMS)
    return Target(
        cli_url(), topology, db or default_db(), flow_name or "default", id_field or "msg_id"
    )


def _from_flow_file(flow_file: Path, flow_name: str, db: LedgerTarget | None) -> Target:
    """--flows FILE: the flow --flow names (its default, `default`, may be left out when
    the file has one rabbitmq flow)."""

    ff = load_or_exit(flow_file, ())
    setup_logs()
    named = {f.name: f for f in ff.flows}
    rabbit = [f for f in ff.flows if rabbit_of(f.source) is not None]
    if flow_name in named:
        flow = named[flow_name]
        if rabbit_of(flow.source) is None:
            raise UsageError(f"{flow_file}: flow {flow_name!r} is not a rabbitmq flow")
    elif flow_name == "default" and len(rabbit) == 1:
        flow = rabbit[0]
    elif flow_name == "default":
        raise UsageError(f"{flow_file}: {len(rabbit)} rabbitmq flows: name one with --flow NAME")
    else:
        raise UsageError(
            f"--flow: {flow_name!r}: no such flow in {flow_file}"
            f" (it has: {', '.join(named) or 'none'})"
        )
    topology = Topology.for_source(flow.source).check()
    return Target(
        amqp_url(flow.source.url), topology, db or ff.ledger, flow.name, flow.message.id_field
    )


def open_ledger(target: Target) -> Any:
    """The flow's ledger, never created: a dead-letter command on a wrong --db must say
    so, not make an empty ledger that knows no reason and records the operation away
    from the consumer's."""
    try:
        return open_target(target.db, "amqp", flow=target.flow, create=False)
    except NotFound:
        raise NotFound(
            f"{describe(target.db)}: no ledger here; give the consumer's ledger with --db"
            " (or EAI_MQ_DB)"
        ) from None


def selection_for_change(values: dict[str, Any]) -> Any:

    return Selection.for_change(values.pop("all_"), tuple(values.pop("ids")), values.pop("reason"))


def change_filters(f: Callable[..., Any]) -> Callable[..., Any]:
    """--all | --id ID… | --reason R: exactly one (checked in Selection.for_change)."""
    for opt in reversed(
        [
            click.option("--all", "all_", is_flag=True, help="Every dead letter of the queue."),
            click.option(
                "--id", "ids", multiple=True, metavar="ID", help="This message_id (repeatable)."
            ),
            click.option(
                "--reason",
                metavar="R",
                help="Those the ledger says died of R (http-503 …; 'unknown': no ledger row).",
            ),
        ]
    ):
        f = opt(f)
    return f
