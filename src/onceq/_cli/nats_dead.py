"""`onceq nats dead list | replay | purge`: a NATS flow's dead letters, in place."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from onceq._cli.broker_options import JSON_HELP, rate_option
from onceq._cli.db_option import db_option
from onceq._cli.flow_options import flow_name_option
from onceq._cli.nats import cli_url
from onceq._cli.output import console, emit_json
from onceq._core import loop as event_loop
from onceq._ledger.target import Target, describe
from onceq._ledger.target import open_ledger as open_target
from onceq._sources.nats.dead import Selection, run
from onceq._sources.nats.plugin import NatsSource
from onceq.errors import NotFound, UsageError


def _options(change: bool) -> Any:
    def decorate(f: Any) -> Any:
        opts: list[Callable[[Any], Any]] = [
            click.option("--stream", required=True, metavar="S", help="The flow's stream."),
            click.option("--durable", required=True, metavar="D", help="Its durable consumer."),
            click.option(
                "--dead-subject", metavar="SUBJ", help="The dead-letter subject (onceq.dead.S)."
            ),
            flow_name_option("The flow whose ledger rows and attempts are read and reset."),
            db_option("The consumer's ledger (default ./processed.db; never created)."),
            click.option("--all", "all_", is_flag=True, help="Every dead letter."),
            click.option("--id", "ids", multiple=True, metavar="ID", help="This message id."),
            click.option("--reason", metavar="R", help="Dead letters of this reason."),
            click.option("--json", "as_json", is_flag=True, help=JSON_HELP),
        ]
        if change:
            opts.append(click.option("--dry-run", is_flag=True, help="Say what, change nothing."))
        for opt in reversed(opts):
            f = opt(f)
        return f

    return decorate


@click.group()
def dead() -> None:
    """A flow's dead letters: list them in place, replay them, purge them.

    \b
    Example:
      onceq nats dead list --stream INVOICES --durable worker --flow invoices --db ./nats.db
    """


def _go(action: str, values: dict[str, Any]) -> None:
    ids, reason, all_ = tuple(values["ids"]), values["reason"], values["all_"]
    chosen = sum(bool(x) for x in (ids, reason, all_))
    if action != "list" and chosen != 1:
        raise UsageError(f"nats dead {action}: give one of --all, --id ID or --reason R")
    if action == "list" and chosen > 1:
        raise UsageError("nats dead list: give at most one of --all, --id ID or --reason R")
    yes = bool(values.get("yes"))
    if action == "purge" and not (yes or values.get("dry_run") or sys.stdin.isatty()):
        raise UsageError("purge: no terminal to confirm on; give --yes to delete without asking")
    url = cli_url()
    source = NatsSource(values["stream"], values["durable"], dead_subject=values["dead_subject"])
    problem = source.setup().problems()
    bad = [p for p in problem if not p.startswith("subject")]
    if bad:
        raise UsageError("--" + bad[0].replace("_", "-", 1))
    db: Target = values["db"] or Path("processed.db")
    try:
        ledger = open_target(db, "nats", flow=values["flow_name"], create=False)
    except NotFound:
        if action != "list":
            raise NotFound(
                f"{describe(db)}: no ledger here; give the consumer's ledger with --db"
            ) from None
        ledger = None
    try:
        report = event_loop.run(
            run(
                action,
                url,
                source,
                ledger,
                Selection(all_, ids, reason),
                dry_run=bool(values.get("dry_run")),
                rate=values.get("rate"),
                confirm=None if action != "purge" or yes else _ask(source.stream),
            )
        )
    finally:
        if ledger is not None:
            ledger.close()
    if values["as_json"]:
        emit_json(report.as_dict())
        return
    out = console()
    for row in report.letters:
        attempts = "" if row["attempts"] is None else f", {row['attempts']} attempt(s)"
        out.print(f"{row['seq']}: {row['msg_id']} ({row['reason']}{attempts})", markup=False)
    n = len(report.letters)
    if action == "list":
        out.print(f"{n} dead letter(s)", markup=False)
    elif report.declined:
        out.print(f"purge declined: {n} dead letter(s) left", markup=False)
    elif report.dry_run:
        out.print(f"dry run: {action} would take {n} dead letter(s); nothing changed", markup=False)
    else:
        done = report.replayed if action == "replay" else report.purged
        out.print(f"{action}ed {done} dead letter(s) (operation {report.op})", markup=False)


def _ask(stream: str) -> Callable[[int], bool]:
    def ask(n: int) -> bool:
        return click.confirm(
            f"delete {n} dead letter(s) of {stream} for good?", default=False, err=True
        )

    return ask


@dead.command("list")
@_options(change=False)
def list_(**values: Any) -> None:
    """The dead letters, read in place: sequence, id, reason, attempts.

    \b
    Example:
      onceq nats dead list --stream INVOICES --durable worker --flow invoices --db ./nats.db
      onceq nats dead list --stream INVOICES --durable worker --reason http-422 --json
    """
    _go("list", values)


@dead.command()
@_options(change=True)
@rate_option()
def replay(**values: Any) -> None:
    """Reset their attempts in the ledger, publish each back to the work subject
    (PubAck awaited), then delete the dead letter.

    --rate N publishes at most N copies per second (the first at once, copy i no
    earlier than i/N seconds after it), so a partner that just recovered is not hit
    by every dead letter at once.

    \b
    Example:
      onceq nats dead replay --stream INVOICES --durable worker --db ./nats.db --id INV-6
      onceq nats dead replay --stream INVOICES --durable worker --reason http-503 --dry-run
      onceq nats dead replay --stream INVOICES --durable worker --db ./nats.db --all --rate 50
    """
    _go("replay", values)


@dead.command()
@_options(change=True)
@click.option("--yes", is_flag=True, help="Do not ask: delete (needed without a terminal).")
def purge(**values: Any) -> None:
    """Record their ids in the ledger's audit, then delete them.

    Asks for confirmation (showing how many) unless --yes; without a terminal to
    ask on and without --yes it refuses (exit 2) and deletes nothing.

    \b
    Example:
      onceq nats dead purge --stream INVOICES --durable worker --reason http-422 --dry-run
      onceq nats dead purge --stream INVOICES --durable worker --db ./nats.db --all --yes
    """
    _go("purge", values)
