"""`onceq dirq …`: the directory queue commands.

Every command but `init` and `lag` lives in its own module, imported only when it
runs (a LazyGroup): `onceq dirq lag` runs from a monitor every few seconds, and this
module is all it loads, so it stays light (no asyncio, sqlite3, rich, runner) while
the others import what they need at their tops.
"""

from __future__ import annotations

from pathlib import Path

import click

from onceq._cli.lazy import LazyGroup
from onceq._cli.output import emit_json
from onceq._sources.dirq.queue import DirQueue
from onceq.errors import NotFound, UsageError

NEW_QDIR = click.Path(path_type=Path, file_okay=False)  # init: a folder to create

# name -> (module, command, the first sentence of its help), as onceq._cli.COMMANDS.
LAZY = {
    "consume": (
        "onceq._cli.dirq_consume",
        "consume",
        "Consume every message in QDIR/inbox into the ledger, effectively once.",
    ),
    "dead": (
        "onceq._cli.dirq_dead",
        "dead",
        "A directory queue's dead letters: the files in QDIR/error/.",
    ),
    "order-check": (
        "onceq._cli.dirq_results",
        "order_check",
        "Find repeated and missing sequence numbers per group in the ledger.",
    ),
    "replay": (
        "onceq._cli.dirq_dead",
        "replay",
        "Move error/FILE (or every file, or those of one reason) back to inbox/.",
    ),
    "report": (
        "onceq._cli.dirq_results",
        "report",
        "Write QDIR/dup.txt and QDIR/error.csv from the ledger and error/.",
    ),
    "schema": (
        "onceq._cli.dirq_results",
        "schema",
        "The fields of a normal message, as CSV `field,type,role`.",
    ),
}


@click.group(cls=LazyGroup, lazy=LAZY)
def dirq() -> None:
    """A queue that is a folder: inbox/ processing/ done/ error/.

    \b
    Example:
      onceq dirq init ./q --from ./fixtures/orders   # after: onceq sample ./fixtures
      onceq dirq consume ./q
      onceq dirq lag ./q 100
    """


@dirq.command()
@click.argument("qdir", type=NEW_QDIR)
@click.option(
    "--from", "source", type=click.Path(path_type=Path), help="Copy DIR/*.json into inbox/."
)
def init(qdir: Path, source: Path | None) -> None:
    """Create QDIR's four folders and copy messages into inbox/.

    \b
    Example:
      onceq dirq init ./q --from ./fixtures/orders   # after: onceq sample ./fixtures
    """
    n = DirQueue(qdir).init(source)
    click.echo(f"{qdir}: ready, {n} message(s) queued")


@dirq.command(context_settings={"ignore_unknown_options": True})
@click.argument("qdir")
@click.argument("threshold")
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
def lag(qdir: str, threshold: str, as_json: bool) -> None:
    """Print `inbox=N processing=N error=N`; exit 1 when inbox > THRESHOLD.

    Counts message files only (not dotfiles or *.tmp partial writes), including
    the files claimed in every processing/w-*/ worker folder. Exit 0 when the
    inbox holds THRESHOLD files or fewer, 1 when more, 2 for any bad argument:
    no such queue folder (3 in the other commands; a monitor reads only 0, 1
    and 2 here), or THRESHOLD not a non-negative integer.

    Once a file has waited for a retry the queue has a retry/ folder: the line
    then ends with ` retry=N` (--json adds "retry" and "waiting"), and since
    those files wait too, THRESHOLD is compared with inbox + retry.

    \b
    Example:
      onceq dirq lag ./q 100 || echo "the consumers are behind"
    """
    # Deliberately light (this module's imports): a monitor may run this every second.
    if not threshold.isascii() or not threshold.isdigit():
        raise UsageError(f"threshold {threshold!r}: not a non-negative integer")
    limit = int(threshold)
    queue = DirQueue(qdir)
    try:
        counts = queue.counts(("inbox", "processing", "error", "retry"))
    except NotFound as exc:  # a wrong folder is a bad argument here (exit 2, not 3)
        raise UsageError(str(exc)) from exc
    waiting = counts["inbox"] + counts["retry"]
    over = waiting > limit
    # Without retry/ both outputs are exactly the exercise's (a monitor may parse them).
    has_retry = queue.has_retry()
    if as_json:
        if not has_retry:
            del counts["retry"]
        extra = {"waiting": waiting} if has_retry else {}
        emit_json({**counts, **extra, "threshold": limit, "over": over})
    else:
        line = f"inbox={counts['inbox']} processing={counts['processing']} error={counts['error']}"
        click.echo(line + (f" retry={counts['retry']}" if has_retry else ""))
    if over:
        click.get_current_context().exit(1)
