"""`onceq mq dead list|show|replay|purge`: a flow's dead letters, listed, shown,
replayed (one with a corrected body), purged.

The CLI parses and reports; onceq._sources.amqp.dead decides (order of the steps, what is
recorded when). Which flow and ledger the options name: onceq._cli.mq_dead_target.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import click

from onceq._cli.broker_options import rate_option
from onceq._cli.mq_dead_output import print_body, print_change, print_list
from onceq._cli.mq_dead_target import (
    change_filters,
    open_ledger,
    resolve,
    selection_for_change,
    target_options,
)
from onceq._cli.output import emit_json
from onceq._sources.amqp.dead import browse
from onceq._sources.amqp.dead import purge as do_purge
from onceq._sources.amqp.dead import replay as do_replay
from onceq._sources.amqp.dead_body import load_body
from onceq._sources.amqp.dead_letter import Selection, parse_since
from onceq.errors import NotFound, UsageError


def _run(coro: Any) -> Any:
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
@rate_option()
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
