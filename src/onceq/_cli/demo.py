"""`onceq demo`: the built-in sample through a directory queue into SQLite."""

from __future__ import annotations

import shutil
from pathlib import Path

import click

from onceq._cli.output import console, emit_json
from onceq._exercise.dirq_batch import consume_queue as consume
from onceq._exercise.sample import sample_dir
from onceq._ledger.target import open_ledger
from onceq._sources.dirq.order import check_order
from onceq._sources.dirq.queue import DirQueue
from onceq._sources.dirq.report import write_report
from onceq.errors import Conflict, QueueError

MARKER = ".onceq-demo"


@click.command()
@click.option(
    "--dir",
    "root",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("onceq-demo"),
    show_default=True,
    help="Folder for the demo queue (recreated on every run).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def demo(root: Path, as_json: bool) -> None:
    """Run the built-in sample (20 orders) through a directory queue into SQLite.

    \b
    Example:
      onceq demo                  # ./onceq-demo: expect done 18, error 2, 15 rows
      onceq demo --dir /tmp/d --json
    """

    if root.exists() and not (root / MARKER).exists():
        raise Conflict(f"{root}: exists and is not an onceq demo folder; choose --dir")
    try:
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
        (root / MARKER).write_text("made by onceq demo; deleted by the next run\n")
    except OSError as exc:  # a folder we may not write: one line, not a traceback
        raise QueueError(f"{exc.filename or root}: cannot make the demo: {exc.strerror}") from exc
    queue = DirQueue(root)
    queued = queue.init(sample_dir())
    stats = consume(root)
    with open_ledger(queue.default_db) as ledger:
        dup_path, err_path = write_report(queue, ledger)
        rows = check_order(ledger)
        counts = queue.counts()
        ledger_counts = ledger.counts()
    result = {
        "queue": str(root),
        "queued": queued,
        "run": stats.as_dict(),
        "folders": counts,
        "processed_rows": ledger_counts["processed"],
        "duplicate_ids": dup_path.read_text().split(),
        "order_check": "OK" if not rows else f"{len(rows)} problem rows",
    }
    if as_json:
        emit_json(result)
        return
    from rich.table import Table
    from rich.text import Text

    # Text, not markup: a folder name with brackets is printed as it is.
    t = Table(title=Text(f"onceq demo — {queued} messages through {root}/"), show_header=True)
    t.add_column("what")
    t.add_column("result", justify="right")
    for k, v in counts.items():
        t.add_row(f"{k}/", str(v))
    t.add_row("processed rows (unique msg_id)", str(ledger_counts["processed"]))
    t.add_row("duplicates ignored", ", ".join(result["duplicate_ids"]) or "none")
    for reason, n in sorted(stats.reasons.items()):
        t.add_row(f"quarantined: {reason}", str(n))
    t.add_row("order check", result["order_check"])
    console().print(t)
    # markup=False: a path is printed as it is, brackets and all.
    console().print(f"Reports: {dup_path}, {err_path}. Ledger: {queue.default_db}", markup=False)
