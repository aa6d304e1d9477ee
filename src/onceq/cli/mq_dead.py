"""`onceq mq dead list|show|replay|purge`: a flow's dead letters, listed, shown,
replayed (one with a corrected body), purged.

The CLI parses and reports; onceq.sources.amqp.dead decides (order of the steps, what is
recorded when).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from onceq.cli.db_option import db_option
from onceq.cli.flow_options import flow_name_option
from onceq.cli.mq_consume import cli_url
from onceq.cli.mq_dead_output import print_body, print_change, print_list
from onceq.cli.output import emit_json
from onceq.errors import NotFound, UsageError
from onceq.ledger.target import Target as LedgerTarget

JSON_HELP = "Print the outcome as JSON."
FILTER_OPTIONS = ("all_", "ids", "reason")


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
    from onceq.sources.amqp.consume import default_db
    from onceq.sources.amqp.topology import Topology

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
        id_field = "guid"  # the claims preset (onceq.exercise.presets.CLAIMS)
    return Target(
        cli_url(), topology, db or default_db(), flow_name or "default", id_field or "msg_id"
    )


def _from_flow_file(flow_file: Path, flow_name: str, db: LedgerTarget | None) -> Target:
    """--flows FILE: the flow --flow names (its default, `default`, may be left out when
    the file has one rabbitmq flow)."""
    from onceq.cli.run import load_or_exit
    from onceq.core.logs import setup as setup_logs
    from onceq.sources.amqp.plugin import RabbitSource
    from onceq.sources.amqp.topology import Topology
    from onceq.sources.amqp.url import amqp_url

    ff = load_or_exit(flow_file, ())
    setup_logs()
    named = {f.name: f for f in ff.flows}
    rabbit = [f for f in ff.flows if isinstance(f.source, RabbitSource)]
    if flow_name in named:
        flow = named[flow_name]
        if not isinstance(flow.source, RabbitSource):
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
    from onceq.ledger.target import describe, open_ledger

    try:
        return open_ledger(target.db, "amqp", flow=target.flow, create=False)
    except NotFound:
        raise NotFound(
            f"{describe(target.db)}: no ledger here; give the consumer's ledger with --db"
            " (or EAI_MQ_DB)"
        ) from None


def selection_for_change(values: dict[str, Any]) -> Any:
    from onceq.sources.amqp.dead_letter import Selection

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


def _run(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)


@click.group()
def dead() -> None:
    """A flow's dead letters: list them in place, show one's body, replay them (one
    with a corrected body), purge them.

    The flow is the claims preset (claim.dead) unless --queue Q (its STEM.dead) or
    --flows FILE --flow NAME says otherwise; the ledger is --db, EAI_MQ_DB or
    ./processed.db, as for `onceq mq consume`. Replays and purges are recorded in
    the ledger (table dead_ops: when, which filter, how many, which ids purged).

    \b
    Example:
      onceq mq dead list
      onceq mq dead show 7f3c1a52-0007-4a8e-9c11-5b2d7e0c0007
      onceq mq dead replay --reason http-503 --dry-run
      onceq mq dead purge --reason http-422 --yes
    """


@dead.command("list")
@click.option("--reason", metavar="R", help="Only those that died of R ('unknown': no ledger row).")
@click.option(
    "--since", metavar="T", help="Only those dead since T: a duration (1h) or an ISO time."
)
@click.option("--limit", type=click.IntRange(1), metavar="N", help="Show at most N.")
@target_options
def list_(reason: str | None, since: str | None, limit: int | None, **values: Any) -> None:
    """Show the dead letters, head first, and leave every one of them in place.

    Per message: its position, message_id, the reason, attempts and time of death
    the ledger recorded (reason 'unknown' when the ledger has no dead row for it;
    a letter with malformed properties shows why, e.g. "encoding: header 'x-\\xff':
    its name is not UTF-8 text"), the broker's x-death (queue, reason, count) and
    the body's size. Header values are never shown.

    \b
    Example:
      onceq mq dead list --reason http-503 --since 1h
      onceq mq dead list --queue invoice.in --db invoices.db --json
    """
    from onceq.sources.amqp.dead import browse
    from onceq.sources.amqp.dead_letter import Selection, parse_since

    as_json = values.pop("as_json")
    selection = Selection(reason=reason, since=parse_since(since) if since else None)
    target = resolve(values)
    with open_ledger(target) as ledger:
        report = _run(
            browse(
                target.url,
                target.topology,
                ledger,
                selection,
                id_field=target.id_field,
                limit=limit,
            )
        )
    if as_json:
        emit_json(report.as_dict())
        return
    print_list(report)


@dead.command()
@change_filters
@click.option("--dry-run", is_flag=True, help="Change nothing; print what would move.")
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    metavar="N",
    help="Publish at most N messages per second (default: as fast as confirmed).",
)
@click.option(
    "--body",
    "body_file",
    metavar="FILE",
    type=click.Path(path_type=Path, dir_okay=False),
    help="With one --id: the copy carries FILE (the corrected body) instead of the dead"
    " letter's; FILE's id field must hold ID.",
)
@target_options
def replay(dry_run: bool, rate: float | None, body_file: Path | None, **values: Any) -> None:
    """Move dead letters back to the work exchange, their attempts reset.

    For each selected dead letter: the ledger records the replay first (its earlier
    failures stop counting, so it gets its retries again), then a copy goes to the
    work exchange with the work routing key (persistent, mandatory, confirmed;
    properties and headers kept, the broker's x-death dropped), and only then the
    dead copy is acked: never lost, at worst twice (a copy of a message already
    processed is acked by the consumer as a duplicate). The others stay where they
    are. Exactly one of --all, --id, --reason; a refusal changes nothing.

    --body FILE repairs a message: with exactly one --id ID, the copy carries FILE
    instead of the dead letter's body (its properties kept), the same steps in the
    same order. FILE must be a JSON object whose id field holds ID (exit 5
    otherwise, 3 when FILE or the dead letter is missing); `onceq mq dead show ID >
    FILE` writes the body to start from.

    \b
    Example:
      onceq mq dead replay --reason http-503 --dry-run
      onceq mq dead replay --id 7f3c1a52-0008-4a8e-9c11-5b2d7e0c0008 --rate 50
      onceq mq dead replay --all --queue invoice.in --db invoices.db --json
      onceq mq dead replay --id INV-5 --body inv-5.json --queue invoice.in --db invoices.db
    """
    from onceq.sources.amqp.dead import replay as do_replay
    from onceq.sources.amqp.dead_body import load_body

    as_json = values.pop("as_json")
    selection = selection_for_change(values)
    if body_file is not None and len(selection.ids) != 1:
        raise UsageError(
            "--body FILE replaces one message's body: give exactly one --id ID with it"
        )
    target = resolve(values)
    # Checked before the broker or the ledger is asked: a refused body changes nothing.
    new_body = None if body_file is None else load_body(body_file, target.id_field, *selection.ids)
    with open_ledger(target) as ledger:
        report = _run(
            do_replay(
                target.url,
                target.topology,
                ledger,
                selection,
                id_field=target.id_field,
                dry_run=dry_run,
                rate=rate,
                body=new_body,
            )
        )
    if new_body is not None and not report.matched:
        raise NotFound(
            f"{target.topology.dead_letter_queue}: no dead letter with message_id"
            f" {selection.ids[0]!r}; nothing replayed"
        )
    print_change(report, as_json)


@dead.command()
@click.argument("msg_id", metavar="ID")
@target_options
def show(msg_id: str, **values: Any) -> None:
    """Write the body of the dead letter ID to stdout, as it is; leave it in place.

    The first step of a repair: `onceq mq dead show ID > FILE`, correct FILE, then
    `onceq mq dead replay --id ID --body FILE`. A byte that is not UTF-8 is written
    as \\xNN (and said on stderr); when several dead letters have that id, the one
    nearest the head is shown (their number on stderr). --json: the letter as
    `list --json` shows it, with "body", "utf8" and "same_id" (how many have ID).
    Exit 3 when no dead letter has that id.

    \b
    Example:
      onceq mq dead show 7f3c1a52-0007-4a8e-9c11-5b2d7e0c0007 > claim-7.json
      onceq mq dead show INV-5 --queue invoice.in --db invoices.db --json
    """
    from onceq.sources.amqp.dead import browse
    from onceq.sources.amqp.dead_letter import Selection

    as_json = values.pop("as_json")
    target = resolve(values)
    with open_ledger(target) as ledger:
        report = _run(
            browse(
                target.url,
                target.topology,
                ledger,
                Selection(ids=(msg_id,)),
                id_field=target.id_field,
                bodies=True,
            )
        )
    print_body(report, msg_id, as_json)


@dead.command()
@change_filters
@click.option("--dry-run", is_flag=True, help="Change nothing; print what would be deleted.")
@click.option("--yes", is_flag=True, help="Do not ask: delete (needed without a terminal).")
@target_options
def purge(dry_run: bool, yes: bool, **values: Any) -> None:
    """Delete dead letters for good, recorded in the ledger with their ids.

    Asks for confirmation (showing how many) unless --yes; without a terminal to
    ask on and without --yes it refuses (exit 2) and deletes nothing. The ids are
    recorded before the messages are acked. Exactly one of --all, --id, --reason.

    \b
    Example:
      onceq mq dead purge --reason http-422 --yes
      onceq mq dead purge --id 7f3c1a52-0007-4a8e-9c11-5b2d7e0c0007 --dry-run
    """
    from onceq.sources.amqp.dead import purge as do_purge

    as_json = values.pop("as_json")
    selection = selection_for_change(values)
    if not (yes or dry_run or sys.stdin.isatty()):
        raise UsageError("purge: no terminal to confirm on; give --yes to delete without asking")
    target = resolve(values)

    def ask(letters: list[Any]) -> bool:
        q = target.topology.dead_letter_queue
        return click.confirm(
            f"delete {len(letters)} dead letter(s) from {q} for good?", default=False, err=True
        )

    with open_ledger(target) as ledger:
        report = _run(
            do_purge(
                target.url,
                target.topology,
                ledger,
                selection,
                id_field=target.id_field,
                dry_run=dry_run,
                confirm=None if yes else ask,
            )
        )
    print_change(report, as_json)
