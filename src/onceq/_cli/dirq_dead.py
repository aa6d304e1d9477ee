"""`onceq dirq dead list`, `onceq dirq dead purge` and `onceq dirq replay`: a directory
queue's dead letters.

The files in error/ are its dead letters; the ledger says what each died of. The
library (onceq._sources.dirq.dead, onceq._sources.dirq.queue) decides and checks; this module parses
and reports.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from onceq._cli.db_option import db_option
from onceq._cli.dirq_args import DB_HELP, QDIR, READ_FLOW_HELP
from onceq._cli.flow_options import flow_name_option
from onceq._cli.output import emit_json, note_new_ledger
from onceq._ledger.sqlite import check_flow_name
from onceq._ledger.target import Target, open_ledger
from onceq._sources.dead_api import DeadAction, DeadSelection
from onceq._sources.dirq import dead_items
from onceq._sources.dirq.dead import dead_files, replay_files, select
from onceq._sources.dirq.queue import DirQueue
from onceq.errors import NotFound, UsageError


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


@dead.command("purge")
@click.argument("qdir", type=QDIR)
@click.argument("files", nargs=-1, metavar="[FILE]...")
@click.option("--all", "everything", is_flag=True, help="Delete every file in error/.")
@click.option("--reason", metavar="R", help="Delete the files that died of this reason (exact).")
@click.option("--dry-run", is_flag=True, help="Change nothing; print what would be deleted.")
@click.option("--yes", is_flag=True, help="Do not ask: delete (needed without a terminal).")
@db_option(DB_HELP)
@flow_name_option("The flow whose dead letters these are (the purge is recorded under it).")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def purge(
    qdir: Path,
    files: tuple[str, ...],
    everything: bool,
    reason: str | None,
    dry_run: bool,
    yes: bool,
    db: Target | None,
    flow_name: str,
    as_json: bool,
) -> None:
    """Delete files from QDIR/error/ for good, recorded in the ledger with their ids.

    Exactly one of FILE…, --all, --reason R. Asks for confirmation (showing how
    many) unless --yes; without a terminal to ask on and without --yes it refuses
    (exit 2) and deletes nothing. The purge is one audited operation (the
    ledger's dead_ops) and its ids (the msg_id, or the file name of a file that
    never parsed) are recorded before the first file goes: a killed purge may
    list a file still there, never delete an unlisted one. Exactly the files
    counted in the question are deleted; one replayed meanwhile is left alone.

    A refused purge changes nothing: exit 2 for a wrong combination or something
    in error/ that is not a regular file, 3 when there is no ledger, a FILE is
    not in error/, or nothing matches.

    \b
    Example:
      onceq dirq dead purge ./q --reason parse --dry-run
      onceq dirq dead purge ./q msg-009.json --yes
      onceq dirq dead purge ./inv --all --flow invoices --yes --json
    """
    chosen = [w for w, on in (("FILE", bool(files)), ("--all", everything),
                              ("--reason", reason is not None)) if on]  # fmt: skip
    if len(chosen) != 1:
        raise UsageError(
            "purge: name exactly one of FILE…, --all or --reason R"
            + (f" (not {' and '.join(chosen)})" if chosen else "")
        )
    check_flow_name(flow_name)
    if not (yes or dry_run or sys.stdin.isatty()):
        raise UsageError("purge: no terminal to confirm on; give --yes to delete without asking")
    queue = DirQueue(qdir).check()
    # The reasons and the audit are the ledger's: a purge reads it and never creates it.
    with open_ledger(db or queue.default_db, flow=flow_name, create=False) as ledger:
        found = dead_items.items(queue, ledger, DeadSelection(files, reason))
        missing = sorted(set(files) - {x.key for x in found})
        if missing:
            raise NotFound(
                f"{queue.folder('error')}: not there: {', '.join(missing)} (nothing purged)"
            )
        if not found:
            what = f"with reason {reason!r}" if reason is not None else "at all"
            raise NotFound(f"{queue.folder('error')}: no file {what}; nothing to purge")
        names = [x.key for x in found]
        if dry_run:
            _print_purge(qdir, names, None, as_json)
            return
        ask = f"delete {len(names)} file(s) from {queue.folder('error')} for good?"
        if not yes and not click.confirm(ask, default=False, err=True):
            click.echo(f"purge declined: {len(names)} file(s) left in error/", err=True)
            return
        # Exactly the files counted: the selection is pinned to their names.
        keys = DeadSelection(tuple(names), reason)
        done = dead_items.purge(queue, ledger, keys, via="cli")
    _print_purge(qdir, names, done, as_json)


def _print_purge(qdir: Path, names: list[str], done: DeadAction | None, as_json: bool) -> None:
    if as_json:
        out = {"dry_run": done is None, "files": names}
        emit_json(out | ({} if done is None else done.as_dict()))
        return
    if done is None:
        click.echo(f"dry run: would delete {len(names)} file(s) from {qdir}/error/: "
                   + ", ".join(names[:10]) + (f" …(+{len(names) - 10})" if len(names) > 10 else "")
                   + "; nothing changed")  # fmt: skip
        return
    for key, why in done.skipped:
        click.echo(f"{key}: not deleted, {why}", err=True)
    click.echo(
        f"{qdir}: {done.done} of {len(names)} file(s) deleted from error/"
        f" (ids recorded, op {done.op})"
    )
