"""`onceq dirq schema`, `order-check` and `report`: what a queue and its ledger hold.

Imported only when one of these commands runs: cli/dirq.py loads it lazily; the
arguments the dirq commands share live in dirq_args.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from onceq._cli.db_option import db_option
from onceq._cli.dirq_args import DB_HELP, DEFAULT_REQUIRED, QDIR, READ_FLOW_HELP, parse_required
from onceq._cli.flow_options import flow_name_option
from onceq._cli.output import emit_json
from onceq._exercise.orders_0_1_0 import MessageSpec
from onceq._ledger.target import Target, open_ledger
from onceq._sources.dirq.files import write_atomic
from onceq._sources.dirq.order import read_sql, render, run_check
from onceq._sources.dirq.queue import DirQueue
from onceq._sources.dirq.report import write_report
from onceq._sources.dirq.schema import schema_csv
from onceq.errors import NotFound, UsageError


def message_spec_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--required and --max-bytes: what makes a valid message, for consume and schema alike."""
    f = click.option(
        "--max-bytes",
        default=1024 * 1024,
        show_default=True,
        type=click.IntRange(1),
        help="Files larger than this are not messages (consume quarantines them unread).",
    )(f)
    return click.option(
        "--required",
        default=DEFAULT_REQUIRED,
        show_default=True,
        help="Comma-separated fields a message must have.",
    )(f)


def write_output(path: Path, text: str) -> Path:
    """Write a result file atomically (a reader never sees half of it)."""
    if not path.parent.is_dir():
        raise NotFound(f"{path.parent}: no such folder for {path.name}")
    if path.is_dir():
        raise UsageError(f"{path}: is a folder, not a file")
    try:
        return write_atomic(path.parent, path.name, text.encode())
    except OSError as exc:  # e.g. a read-only folder: one line naming the file
        raise UsageError(f"{path}: cannot write: {exc.strerror}") from exc


@click.command()
@click.argument("qdir", type=QDIR)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write the CSV here (default: print it).",
)
@message_spec_options
def schema(qdir: Path, output: Path | None, required: str, max_bytes: int) -> None:
    """The fields of a normal message, as CSV `field,type,role`.

    Reads the valid messages (files that would be processed) in inbox/ and done/:
    before a consume they are in inbox/, after it in done/. Quarantined files in
    error/ are not normal messages. type is the JSON type (integer and number
    mixed is number); role is idempotency-key for msg_id, sequence for seq.

    \b
    Example:
      onceq dirq schema ./q -o ./q/schema.csv
    """
    spec = MessageSpec(required=parse_required(required), max_bytes=max_bytes)
    text = schema_csv(qdir, spec)
    if output is None:
        click.echo(text, nl=False)
    else:
        write_output(output, text)
        click.echo(f"{output}: {text.count(chr(10)) - 1} field(s)")


@click.command("order-check")
@click.argument("qdir", type=QDIR, required=False)
@db_option(DB_HELP)
@click.option(
    "--sql",
    "sql_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Run this read-only query instead of the built-in one.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write the result here: `OK`, or a header line and CSV rows.",
)
@flow_name_option(READ_FLOW_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def order_check(
    qdir: Path | None,
    db: Target | None,
    sql_file: Path | None,
    output: Path | None,
    flow_name: str,
    as_json: bool,
) -> None:
    """Find repeated and missing sequence numbers per group in the ledger.

    Runs SQL over one flow's rows in the ledger (its group and sequence fields:
    order_no and seq for the orders preset, any flow's --group-field and
    --seq-field) using the senders' values (never processing times). Sequences
    start at 1, so a first seq above 1 is a gap. The group column is order_no
    for the flow `default`, group for any other.
    The result is `OK` when the query returns no rows; otherwise a header line
    and the rows as CSV. Exit 0 when OK, 1 when problems are found.
    Name the ledger with --db PATH, or QDIR for QDIR/ledger.db.

    \b
    Example:
      onceq dirq order-check --db ./q/ledger.db -o ./q/order-result.txt
      onceq dirq order-check ./q --sql my-check.sql --json
      onceq dirq order-check ./q --flow invoices
    """
    if db is not None:
        path: Target = db
    elif qdir is not None:
        path = DirQueue(qdir).default_db
    else:
        raise UsageError("name the ledger: --db PATH, or QDIR for QDIR/ledger.db")
    sql = read_sql(sql_file) if sql_file is not None else None
    label = "order_no" if flow_name == "default" else "group"
    # A check never creates a ledger.
    with open_ledger(path, flow=flow_name, create=False) as ledger:
        columns, rows = run_check(ledger, sql, label)
    text = render(columns, rows)
    if output is not None:
        write_output(output, text)
    if as_json:
        emit_json(
            {
                "ok": not rows,
                "columns": columns,
                "rows": [dict(zip(columns, r, strict=True)) for r in rows],
            }
        )
    elif output is None:
        click.echo(text, nl=False)
    else:
        click.echo("OK" if not rows else f"{len(rows)} problem row(s): {output}")
    if rows:
        click.get_current_context().exit(1)


@click.command()
@click.argument("qdir", type=QDIR)
@db_option(DB_HELP)
@flow_name_option(READ_FLOW_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def report(qdir: Path, db: Target | None, flow_name: str, as_json: bool) -> None:
    """Write QDIR/dup.txt and QDIR/error.csv from the ledger and error/.

    dup.txt: every msg_id ever ignored as a duplicate, ascending, one a line.
    error.csv: `file,reason`, one row per file now in error/ with the newest
    failure reason the ledger holds for it (`unknown` when it has none). Both
    come from durable state: any run writes the same files. Files waiting for
    a retry (in retry/) are not errors: the summary line counts them apart.

    \b
    Example:
      onceq dirq report ./q && cat ./q/error.csv
    """
    queue = DirQueue(qdir).check()
    with open_ledger(db or queue.default_db, flow=flow_name, create=False) as ledger:
        dup, err = write_report(queue, ledger)
    dups = dup.read_text().split()
    rows = err.read_text().count("\n") - 1
    retrying = queue.counts(("retry",))["retry"]
    if as_json:
        emit_json(
            {
                "dup": str(dup),
                "error": str(err),
                "duplicates": dups,
                "errors": rows,
                "retrying": retrying,
            }
        )
    else:
        # The JSON's words: "duplicates" (ids in dup.txt), "errors" (rows in error.csv).
        line = f"{dup}: {len(dups)} duplicates; {err}: {rows} errors (files in error/)"
        # Only a queue that has retried says so: the exercise's line stays as it was.
        click.echo(line + (f"; {retrying} waiting in retry/" if queue.has_retry() else ""))
