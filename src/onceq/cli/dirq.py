"""`onceq dirq …`: the directory queue commands."""

from __future__ import annotations

from pathlib import Path

import click

from onceq.cli.output import console, emit_json

QDIR = click.Path(path_type=Path, file_okay=False)
DB_HELP = "Ledger database (default: QDIR/ledger.db)."


@click.group()
def dirq() -> None:
    """A queue that is a folder: inbox/ processing/ done/ error/.

    \b
    Example:
      onceq dirq init ./q --from ./fixtures
      onceq dirq consume ./q
      onceq dirq lag ./q 100
    """


@dirq.command()
@click.argument("qdir", type=QDIR)
@click.option(
    "--from", "source", type=click.Path(path_type=Path), help="Copy DIR/*.json into inbox/."
)
def init(qdir: Path, source: Path | None) -> None:
    """Create QDIR's four folders and copy messages into inbox/.

    \b
    Example:
      onceq dirq init ./q --from ./fixtures
    """
    from onceq.dirq.queue import DirQueue

    n = DirQueue(qdir).init(source)
    click.echo(f"{qdir}: ready, {n} message(s) queued")


def _parse_required(value: str) -> tuple[str, ...]:
    fields = tuple(f.strip() for f in value.split(",") if f.strip())
    if not fields:
        raise click.BadParameter("name at least one field")
    return fields


@dirq.command()
@click.argument("qdir", type=QDIR)
@click.option("--db", type=click.Path(path_type=Path, dir_okay=False), help=DB_HELP)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Consumer processes on this queue.",
)
@click.option(
    "--required",
    default="msg_id,order_no,seq,amount",
    show_default=True,
    help="Comma-separated fields a message must have.",
)
@click.option(
    "--max-bytes",
    default=1024 * 1024,
    show_default=True,
    type=click.IntRange(1),
    help="Files larger than this are quarantined unread (reason too-large).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def consume(
    qdir: Path, db: Path | None, workers: int, required: str, max_bytes: int, as_json: bool
) -> None:
    """Consume every message in QDIR/inbox into the ledger, effectively once.

    Each file is claimed by an atomic rename into processing/, recorded in the
    ledger (a duplicate msg_id is recorded as such), and moved to done/ only
    after the commit; bad files go to error/ with a reason. Files a killed
    consumer left in processing/ are recovered first.

    \b
    Example:
      onceq dirq consume ./q --workers 2
    """
    from onceq.dirq.message import MessageSpec
    from onceq.dirq.run import consume as run_consume
    from onceq.dirq.run import consume_parallel

    spec = MessageSpec(required=_parse_required(required), max_bytes=max_bytes)
    if workers > 1:
        stats = consume_parallel(qdir, db, spec, workers)
    elif as_json:
        stats = run_consume(qdir, db, spec)
    else:
        from rich.progress import Progress, SpinnerColumn, TextColumn

        with Progress(
            SpinnerColumn(), TextColumn("{task.description}"), console=console(), transient=True
        ) as progress:
            task = progress.add_task("consuming", total=None)
            seen = 0

            def tick(group: object) -> None:
                nonlocal seen
                seen += len(group)  # type: ignore[arg-type]
                progress.update(task, description=f"consumed {seen}")

            stats = run_consume(qdir, db, spec, on_settled=tick)
    if as_json:
        emit_json(stats.as_dict())
        return
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(stats.reasons.items())) or "none"
    console().print(
        f"{qdir}: {stats.received} received, {stats.processed} processed, "
        f"{stats.duplicates} duplicate(s), {stats.recovered} recovered, "
        f"{stats.dead} quarantined ({reasons})"
    )
