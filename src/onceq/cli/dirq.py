"""`onceq dirq …`: the directory queue commands."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from onceq.cli.flow_options import flow_options
from onceq.cli.output import emit_json, note_new_ledger, print_run_summary

if TYPE_CHECKING:
    from onceq.consumer import Stats

# A QDIR that is missing, or a file, is "not a queue": exit 3 from DirQueue.check(),
# the same in every command (click's own file_okay check would make a file exit 2).
QDIR = click.Path(path_type=Path)
NEW_QDIR = click.Path(path_type=Path, file_okay=False)  # init: a folder to create
DEFAULT_REQUIRED = "msg_id,order_no,seq,amount"
DB_HELP = "Ledger database (default: QDIR/ledger.db); its folder must exist."


@click.group()
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
    from onceq.dirq.queue import DirQueue

    n = DirQueue(qdir).init(source)
    click.echo(f"{qdir}: ready, {n} message(s) queued")


def _parse_required(value: str) -> tuple[str, ...]:
    fields = tuple(f.strip() for f in value.split(",") if f.strip())
    if not fields:
        raise click.BadParameter(f"{value!r} names no field", param_hint="'--required'")
    return fields


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
    help="Comma-separated fields a message must have (default: msg_id,order_no,seq,amount,"
    " the orders preset; with --id-field: only the id).",
)
@click.option(
    "--max-bytes",
    default=1024 * 1024,
    show_default=True,
    type=click.IntRange(1),
    help="Files larger than this are not messages (consume quarantines them unread).",
)
@flow_options()
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def consume(
    qdir: Path,
    db: Path | None,
    workers: int,
    required: str | None,
    max_bytes: int,
    as_json: bool,
    **flags: Any,
) -> None:
    """Consume every message in QDIR/inbox into the ledger, effectively once.

    Each file is claimed by an atomic rename into processing/, recorded in the
    ledger (a duplicate msg_id is recorded as such), and moved to done/ only
    after the commit; bad files go to error/ with a reason. Files a killed
    consumer left in processing/ are recovered first.

    Without --id-field, --url, --group-field, --seq-field or --keep the messages
    are the exercise's orders (msg_id, order_no, seq, amount into the processed
    table). With them it is your own flow: the id from --id-field, and with
    --url each message is POSTed there (2xx done, 409 done as a partner
    duplicate, other 4xx quarantined; see --success … --transient). On a
    directory queue a transient failure (5xx, timeout) is quarantined at once
    for now: a file gets one try (replay it from error/).

    Signals: this is a batch that is to empty the inbox, so a run that a signal
    stops did not finish, and says so by its exit code: Ctrl-C (SIGINT) or SIGTERM
    stops cleanly (nothing more is claimed, what is held is committed and moved,
    the rest stays in inbox/), prints the summary, and exits 130 (SIGINT) or 143
    (SIGTERM). A second signal stops at once (the next run recovers the claims).
    On a terminal a status line on stderr shows the progress; piped, nothing.

    \b
    Example:
      onceq dirq consume ./q --workers 2
      onceq dirq consume ./inv --id-field invoiceId --url http://127.0.0.1:9300/api/invoices
      onceq dirq consume ./inv --id-field invoiceId --keep customer,total --flow invoices
    """
    from onceq.dirq.queue import DirQueue
    from onceq.dirq.run import Interrupted
    from onceq.flow import open_ledger

    flow = _consume_flow(qdir, workers, required, max_bytes, flags)
    # Refuse a missing queue or an unopenable ledger before any progress display starts.
    queue = DirQueue(qdir).check()
    with open_ledger(flow, db or queue.default_db, "dirq") as ledger:
        if ledger.created:
            note_new_ledger(ledger.path)
    try:
        stats = _run_consume(flow, db, workers)
    except Interrupted as exc:
        # A clean stop: what it did is printed like a finished run's, then the one
        # line and the exit code (130 SIGINT, 143 SIGTERM) come from main().
        _print_summary(qdir, exc.stats, as_json, stopped_by=exc.signal_name)
        raise
    _print_summary(qdir, stats, as_json)


def _consume_flow(
    qdir: Path, workers: int, required: str | None, max_bytes: int, flags: dict[str, Any]
) -> Any:
    """The flags' flow: the orders preset, or the user's own (onceq.cli.flow_options)."""
    from onceq.cli.flow_options import build_flow, check_http_flags, is_generic
    from onceq.flow import DirSource, orders_flow

    if not is_generic(flags):
        check_http_flags(flags)
        flow = orders_flow(
            qdir,
            workers=workers,
            required=_parse_required(required or DEFAULT_REQUIRED),
            max_bytes=max_bytes,
        )
        flow.name = flags.get("flow_name") or flow.name
        return flow.validate()
    flags = {**flags, "required": required}
    return build_flow(
        DirSource(qdir, workers),
        flags,
        rabbit=False,
        timeout=flags.pop("http_timeout"),
        concurrency=5,
        max_bytes=max_bytes,
    )


def _run_consume(flow: Any, db: Path | None, workers: int) -> Stats:
    from onceq.cli.progress import live_progress
    from onceq.dirq.run import DEAD_WORD, consume, consume_parallel

    if workers > 1:  # the work is in child processes; they report only at their end
        return consume_parallel(flow, db, None, workers)
    with live_progress(str(flow.source.path), DEAD_WORD) as on_settled:
        return consume(flow, db, on_settled=on_settled)


def _print_summary(qdir: Path, stats: Stats, as_json: bool, stopped_by: str = "") -> None:
    if as_json:
        emit_json({**stats.as_dict(), **({"stopped_by": stopped_by} if stopped_by else {})})
        return
    print_run_summary(stats, head=f"{qdir}: ")


def _write_output(path: Path, text: str) -> Path:
    """Write a result file atomically (a reader never sees half of it)."""
    from onceq.dirq.files import write_atomic
    from onceq.errors import NotFound, UsageError

    if not path.parent.is_dir():
        raise NotFound(f"{path.parent}: no such folder for {path.name}")
    if path.is_dir():
        raise UsageError(f"{path}: is a folder, not a file")
    try:
        return write_atomic(path.parent, path.name, text.encode())
    except OSError as exc:  # e.g. a read-only folder: one line naming the file
        raise UsageError(f"{path}: cannot write: {exc.strerror}") from exc


@dirq.command()
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
    from onceq.dirq.message import MessageSpec
    from onceq.dirq.schema import schema_csv

    spec = MessageSpec(required=_parse_required(required), max_bytes=max_bytes)
    text = schema_csv(qdir, spec)
    if output is None:
        click.echo(text, nl=False)
    else:
        _write_output(output, text)
        click.echo(f"{output}: {text.count(chr(10)) - 1} field(s)")


@dirq.command("order-check")
@click.argument("qdir", type=QDIR, required=False)
@click.option("--db", type=click.Path(path_type=Path, dir_okay=False), help=DB_HELP)
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
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def order_check(
    qdir: Path | None, db: Path | None, sql_file: Path | None, output: Path | None, as_json: bool
) -> None:
    """Find repeated and missing sequence numbers per order_no in the ledger.

    Runs SQL over the `processed` table using the senders' seq values (never
    processing times). Sequences start at 1, so a first seq above 1 is a gap.
    The result is `OK` when the query returns no rows; otherwise a header line
    and the rows as CSV. Exit 0 when OK, 1 when problems are found.
    Name the ledger with --db PATH, or QDIR for QDIR/ledger.db.

    \b
    Example:
      onceq dirq order-check --db ./q/ledger.db -o ./q/order-result.txt
      onceq dirq order-check ./q --sql my-check.sql --json
    """
    from onceq.dirq.order import read_sql, render, run_check
    from onceq.dirq.queue import DirQueue
    from onceq.errors import UsageError
    from onceq.ledger import Ledger

    if db is None and qdir is None:
        raise UsageError("name the ledger: --db PATH, or QDIR for QDIR/ledger.db")
    path = db if db is not None else DirQueue(qdir).default_db  # type: ignore[arg-type]
    sql = read_sql(sql_file) if sql_file is not None else None
    with Ledger(path, create=False) as ledger:  # a check never creates a ledger
        columns, rows = run_check(ledger, sql)
    text = render(columns, rows)
    if output is not None:
        _write_output(output, text)
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

    \b
    Example:
      onceq dirq lag ./q 100 || echo "the consumers are behind"
    """
    # Deliberately light: no rich, no ledger; a monitor may run this every second.
    from onceq.dirq.queue import DirQueue
    from onceq.errors import NotFound, UsageError

    if not threshold.isascii() or not threshold.isdigit():
        raise UsageError(f"threshold {threshold!r}: not a non-negative integer")
    limit = int(threshold)
    try:
        counts = DirQueue(qdir).counts(("inbox", "processing", "error"))
    except NotFound as exc:  # a wrong folder is a bad argument here (exit 2, not 3)
        raise UsageError(str(exc)) from exc
    over = counts["inbox"] > limit
    if as_json:
        emit_json({**counts, "threshold": limit, "over": over})
    else:
        click.echo(
            f"inbox={counts['inbox']} processing={counts['processing']} error={counts['error']}"
        )
    if over:
        click.get_current_context().exit(1)


@dirq.command(context_settings={"ignore_unknown_options": True})
@click.argument("qdir", type=QDIR)
@click.argument("file")
@click.option("--db", type=click.Path(path_type=Path, dir_okay=False), help=DB_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def replay(qdir: Path, file: str, db: Path | None, as_json: bool) -> None:
    """Move error/FILE back to inbox/FILE and record the replay in the ledger.

    FILE is a plain file name in QDIR/error/. A refused replay changes nothing,
    neither the folders nor the ledger: exit 2 for a bad name ('..', 'a/b', ''),
    3 when error/FILE does not exist, 4 when inbox/FILE already exists.

    \b
    Example:
      onceq dirq replay ./q msg-009.json && onceq dirq consume ./q
    """
    from onceq.dirq.queue import DirQueue
    from onceq.ledger import Ledger

    queue = DirQueue(qdir)

    def record(name: str) -> None:
        # Opened only once every check has passed: a refusal never creates the ledger.
        with Ledger(db or queue.default_db) as ledger:
            if ledger.created:
                note_new_ledger(ledger.path)
            ledger.record_replay(name)

    dst = queue.replay(file, record)
    if as_json:
        emit_json({"replayed": file, "to": str(dst)})
    else:
        click.echo(f"{qdir}: error/{file} -> inbox/{file} (replay recorded)")


@dirq.command()
@click.argument("qdir", type=QDIR)
@click.option("--db", type=click.Path(path_type=Path, dir_okay=False), help=DB_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def report(qdir: Path, db: Path | None, as_json: bool) -> None:
    """Write QDIR/dup.txt and QDIR/error.csv from the ledger and error/.

    dup.txt: every msg_id ever ignored as a duplicate, ascending, one a line.
    error.csv: `file,reason`, one row per file now in error/ with the newest
    failure reason the ledger holds for it (`unknown` when it has none). Both
    come from durable state: any run writes the same files.

    \b
    Example:
      onceq dirq report ./q && cat ./q/error.csv
    """
    from onceq.dirq.queue import DirQueue
    from onceq.dirq.report import write_report
    from onceq.ledger import Ledger

    queue = DirQueue(qdir).check()
    with Ledger(db or queue.default_db, create=False) as ledger:
        dup, err = write_report(queue, ledger)
    dups = dup.read_text().split()
    rows = err.read_text().count("\n") - 1
    if as_json:
        emit_json({"dup": str(dup), "error": str(err), "duplicates": dups, "errors": rows})
    else:
        # The JSON's words: "duplicates" (ids in dup.txt), "errors" (rows in error.csv).
        click.echo(f"{dup}: {len(dups)} duplicates; {err}: {rows} errors (files in error/)")
