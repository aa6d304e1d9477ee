"""`onceq mq dead list|replay|purge`: a flow's dead letters, listed, replayed, purged.

The CLI parses and reports; onceq.amqp.dead decides (order of the steps, what is
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
from onceq.cli.output import console, emit_json
from onceq.errors import NotFound, UsageError
from onceq.ledger_target import Target as LedgerTarget

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
    opts = [
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
    from onceq.amqp.consume import default_db
    from onceq.amqp.topology import Topology

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
        id_field = "guid"  # the claims preset (onceq.presets.CLAIMS)
    return Target(
        cli_url(), topology, db or default_db(), flow_name or "default", id_field or "msg_id"
    )


def _from_flow_file(flow_file: Path, flow_name: str, db: LedgerTarget | None) -> Target:
    """--flows FILE: the flow --flow names (its default, `default`, may be left out when
    the file has one rabbitmq flow)."""
    from onceq.amqp.topology import Topology
    from onceq.amqp.url import amqp_url
    from onceq.cli.run import load_or_exit
    from onceq.flow import RabbitSource
    from onceq.logs import setup as setup_logs

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
    from onceq.ledger_target import describe, open_ledger

    try:
        return open_ledger(target.db, "amqp", flow=target.flow, create=False)
    except NotFound:
        raise NotFound(
            f"{describe(target.db)}: no ledger here; give the consumer's ledger with --db"
            " (or EAI_MQ_DB)"
        ) from None


def selection_for_change(values: dict[str, Any]) -> Any:
    from onceq.amqp.dead_letter import Selection

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
    """A flow's dead letters: list them in place, replay them, purge them.

    The flow is the claims preset (claim.dead) unless --queue Q (its STEM.dead) or
    --flows FILE --flow NAME says otherwise; the ledger is --db, EAI_MQ_DB or
    ./processed.db, as for `onceq mq consume`. Replays and purges are recorded in
    the ledger (table dead_ops: when, which filter, how many, which ids purged).

    \b
    Example:
      onceq mq dead list
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
    from onceq.amqp.dead import browse
    from onceq.amqp.dead_letter import Selection, parse_since

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
    _print_list(report)


def _print_list(report: Any) -> None:
    from rich.table import Table
    from rich.text import Text

    from onceq.ledger_values import text

    out = console()
    if report.matched:
        table = Table()
        for col in ("#", "message_id", "reason", "attempts", "dead at", "x-death", "size"):
            table.add_column(col, justify="right" if col in ("#", "attempts", "size") else "left")
        for x in report.matched:
            when = x.dead_at
            deaths = (
                "; ".join(
                    f"{d.queue} {d.reason} ×{d.count}"
                    + (f" {d.time.isoformat(timespec='seconds')}" if d.time else "")
                    for d in x.deaths
                )
                or "-"
            )
            cells = (
                str(x.position),
                text(x.msg_id) if x.msg_id is not None else "-",
                # A malformed letter's reason with where it is malformed (never a value).
                f"{x.reason}: {x.detail}" if x.refused is not None else x.reason,
                "-" if x.attempts is None else str(x.attempts),
                when.isoformat(timespec="seconds") if when else "-",
                deaths,
                str(x.size),
            )
            # Text, not markup: an id or a reason is printed as it is, brackets and all.
            table.add_row(*(Text(c) for c in cells))
        out.print(table)
    q = report.topology.dead_letter_queue
    what = report.selection.describe()
    out.print(
        f"{len(report.matched)} of {report.total} dead letter(s) in {q} shown"
        f"{'' if what == 'all' else f' ({what})'}; nothing removed",
        markup=False,
    )


@dead.command()
@change_filters
@click.option("--dry-run", is_flag=True, help="Change nothing; print what would move.")
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    metavar="N",
    help="Publish at most N messages per second (default: as fast as confirmed).",
)
@target_options
def replay(dry_run: bool, rate: float | None, **values: Any) -> None:
    """Move dead letters back to the work exchange, their attempts reset.

    For each selected dead letter: the ledger records the replay first (its earlier
    failures stop counting, so it gets its retries again), then a copy goes to the
    work exchange with the work routing key (persistent, mandatory, confirmed;
    properties and headers kept, the broker's x-death dropped), and only then the
    dead copy is acked: never lost, at worst twice (a copy of a message already
    processed is acked by the consumer as a duplicate). The others stay where they
    are. Exactly one of --all, --id, --reason; a refusal changes nothing.

    \b
    Example:
      onceq mq dead replay --reason http-503 --dry-run
      onceq mq dead replay --id 7f3c1a52-0008-4a8e-9c11-5b2d7e0c0008 --rate 50
      onceq mq dead replay --all --queue invoice.in --db invoices.db --json
    """
    from onceq.amqp.dead import replay as do_replay

    as_json = values.pop("as_json")
    selection = selection_for_change(values)
    target = resolve(values)
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
            )
        )
    _print_change(report, as_json)


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
    from onceq.amqp.dead import purge as do_purge

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
    _print_change(report, as_json)


def _print_change(report: Any, as_json: bool) -> None:
    from onceq.cli.output import fail

    if as_json:
        emit_json(report.as_dict())
    else:
        console().print(change_summary(report), markup=False)
    for letter, why in report.skipped:
        q = report.topology.dead_letter_queue
        fail(f"{letter.msg_id!r}: not replayed, {why}; it stays in {q}")
    if report.missing:
        fail(
            f"not in {report.topology.dead_letter_queue}: {', '.join(report.missing)}"
            " (nothing done for these)"
        )


def change_summary(report: Any) -> str:
    """The last line of replay / purge, in the words of its JSON (done, total, filter,
    left, seconds, op)."""
    t = report.topology
    verb = {"replay": "replayed", "purge": "purged"}[report.command]
    filt = f"filter {report.selection.describe()}"
    where = (
        f" to {t.exchange or 'the default exchange'}, key {t.routing_key}"
        if report.command == "replay"
        else ""
    )
    if report.dry_run:
        ids = ", ".join(str(x.msg_id) for x in report.matched[:10])
        more = f" …(+{len(report.matched) - 10})" if len(report.matched) > 10 else ""
        return (
            f"dry run: would have {verb} {len(report.matched)} of {report.total} dead letter(s)"
            f" from {t.dead_letter_queue}{where}; {filt}"
            f"{': ' + ids + more if ids else ''}; nothing changed"
        )
    if report.declined:
        return f"purge declined: {len(report.matched)} dead letter(s) left in {t.dead_letter_queue}"
    op = f"; ledger op {report.op}" if report.op is not None else ""
    return (
        f"{verb} {len(report.done)} of {report.total} dead letter(s) from {t.dead_letter_queue}"
        f"{where}; {filt}; {report.left} left; {report.seconds:.1f}s{op}"
    )
