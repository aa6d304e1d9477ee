"""`onceq dirq dead list` and `onceq dirq replay`: a directory queue's dead letters.

The files in error/ are its dead letters; the ledger says what each died of. The
library (onceq._sources.dirq.dead, onceq._sources.dirq.queue) decides and checks; this module parses
and reports.
"""

from __future__ import annotations

from pathlib import Path

import click

from onceq._cli.db_option import db_option
from onceq._cli.dirq_args import DB_HELP, QDIR, READ_FLOW_HELP
from onceq._cli.flow_options import flow_name_option
from onceq._cli.output import emit_json, note_new_ledger
from onceq._ledger.sqlite import check_flow_name
from onceq._ledger.target import Target, open_ledger
from onceq._sources.dirq.dead import dead_files, replay_files, select
from onceq._sources.dirq.queue import DirQueue
from onceq.errors import UsageError


@click.group()
def dead() -> None:
    """A directory queue's dead letters: the files in QDIR/error/.

    \b
    Example:
      onceq dirq dead list ./q --reason parse
    """


@dead.command("list")
@click.argument("qdir", type=QDIR)
@click.option("--reason", metavar="R", help="Only the files that died of this reason (exact).")
@db_option(DB_HELP)
@flow_name_option(READ_FLOW_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the files as a JSON list.")
def list_(qdir: Path, reason: str | None, db: Target | None, flow_name: str, as_json: bool) -> None:
    """List the files in QDIR/error/ with what the ledger knows of each.

    One line per file, in name order: the file, its reason (`unknown` when the
    ledger has no record of it), its attempts since its last replay, when it
    died, and the failure's detail. It changes nothing and never creates the
    ledger (exit 3 when there is none). --json prints a list of objects with
    file, msg_id, reason, detail, attempts and at.

    \b
    Example:
      onceq dirq dead list ./q
      onceq dirq dead list ./inv --flow invoices --reason http-503 --json
    """
    queue = DirQueue(qdir).check()
    with open_ledger(db or queue.default_db, flow=flow_name, create=False) as ledger:
        files = dead_files(queue, ledger, reason)
    if as_json:
        emit_json([f.as_dict() for f in files])
        return
    for f in files:
        detail = f" {f.detail}" if f.detail else ""
        click.echo(f"{f.file}  {f.reason}  attempts={f.attempts}  {f.at or '-'}{detail}")
    what = f" with reason {reason}" if reason is not None else ""
    click.echo(f"{qdir}: {len(files)} file(s) in error/{what}")


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("qdir", type=QDIR)
@click.argument("file", required=False)
@click.option("--all", "everything", is_flag=True, help="Replay every file in error/.")
@click.option("--reason", metavar="R", help="Replay the files that died of this reason.")
@db_option(DB_HELP)
@flow_name_option("The flow that quarantined FILE (its replay is recorded under that flow).")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def replay(
    qdir: Path,
    file: str | None,
    everything: bool,
    reason: str | None,
    db: Target | None,
    flow_name: str,
    as_json: bool,
) -> None:
    """Move error/FILE (or every file, or those of one reason) back to inbox/.

    Exactly one of FILE, --all, --reason R. Each replay is recorded in the
    ledger, and the file's attempts start again: a transient failure gets its
    retries again. --all and --reason are also audited as one operation
    (the ledger's dead_ops: when, which filter, how many). A replayed file whose
    message was already processed goes to done/ as a duplicate on the next
    consume, never applied twice.

    A refused replay changes nothing, neither the folders nor the ledger (every
    file is checked before the first moves): exit 2 for a bad name ('..', 'a/b',
    '') or a file in error/ that is not a regular file, 3 when error/FILE does
    not exist or nothing matches (or, for --all and --reason, whose reasons are
    the ledger's, when there is no ledger), 4 when a file of that name is
    already in inbox/.

    \b
    Example:
      onceq dirq replay ./q msg-009.json && onceq dirq consume ./q
      onceq dirq replay ./q --reason parse
      onceq dirq replay ./inv --all --flow invoices --json
    """
    chosen = [w for w, on in (("FILE", file is not None), ("--all", everything),
                              ("--reason", reason is not None)) if on]  # fmt: skip
    if len(chosen) != 1:
        raise UsageError(
            "replay: name exactly one of FILE, --all or --reason R"
            + (f" (not {' and '.join(chosen)})" if chosen else "")
        )
    check_flow_name(flow_name)  # before anything moves: a refusal changes nothing
    if file is not None:
        _replay_one(qdir, file, db, flow_name, as_json)
    else:
        _replay_many(qdir, everything, reason, db, flow_name, as_json)


def _replay_one(qdir: Path, file: str, db: Target | None, flow_name: str, as_json: bool) -> None:

    queue = DirQueue(qdir)

    def record(name: str) -> None:
        # Opened only once every check has passed: a refusal never creates the ledger.
        with open_ledger(db or queue.default_db, flow=flow_name) as ledger:
            if ledger.created:
                note_new_ledger(ledger.path)
            ledger.record_replay(name)

    dst = queue.replay(file, record)
    if as_json:
        emit_json({"replayed": file, "to": str(dst)})
    else:
        click.echo(f"{qdir}: error/{file} -> inbox/{file} (replay recorded)")


def _replay_many(
    qdir: Path,
    everything: bool,
    reason: str | None,
    db: Target | None,
    flow_name: str,
    as_json: bool,
) -> None:

    queue = DirQueue(qdir).check()
    # The reasons are the ledger's: a bulk replay reads it and never creates it.
    with open_ledger(db or queue.default_db, flow=flow_name, create=False) as ledger:
        files = select(queue, ledger, everything=everything, reason=reason)
        filter = {"all": True} if everything else {"reason": reason}
        op = replay_files(queue, ledger, files, filter)
    names = [f.file for f in files]
    if as_json:
        emit_json({"replayed": names, "count": len(names), "op": op, "filter": filter})
    else:
        what = "every file" if everything else f"reason {reason}"
        click.echo(
            f"{qdir}: {len(names)} file(s) error/ -> inbox/ ({what}; replays recorded, op {op})"
        )
