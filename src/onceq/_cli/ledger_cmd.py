"""`onceq ledger prune|stats`: the ledger's retention, on SQLite and PostgreSQL alike.

The CLI finds the ledger and the flows' retry policies and reports; onceq._ledger.retention
decides what goes, when a window is too short, and how the batches run.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from onceq._cli.db_option import db_option
from onceq._cli.output import console, emit_json
from onceq._core.retry import parse_duration
from onceq._flows.file import load_flows
from onceq._ledger.retention import cutoff_of
from onceq._ledger.retention import prune as prune_rows
from onceq._ledger.retention import stats as ledger_stats
from onceq._ledger.sqlite import check_flow_name
from onceq._ledger.target import as_target, describe, open_ledger
from onceq.errors import UsageError

ENV_DB = "EAI_MQ_DB"
CLEAR = "\r\x1b[2K"  # to column 0, erase the line
REFRESH = 0.25  # seconds between redraws of the progress line


def _target_options(f: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        db_option(
            "The ledger: an SQLite file or a postgresql:// URL (default: the --flows"
            " file's ledger, else EAI_MQ_DB). Never created: a missing one is exit 3."
        ),
        click.option(
            "--flows",
            "flow_file",
            metavar="FILE",
            type=click.Path(path_type=Path, dir_okay=False),
            help="A flow file: its ledger, and its flows' retry policies (prune's floor).",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print the result as JSON."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _resolve(db: Any, flow_file: Path | None) -> tuple[Any, dict[str, Any]]:
    """(the ledger's target, {flow: RetryPolicy} from the flow file); exit 2 when no
    ledger is named: a prune must never fall back on a default file."""

    policies: dict[str, Any] = {}
    target: Any = db
    if flow_file is not None:
        ff = load_flows(flow_file)
        policies = {f.name: f.retry_policy() for f in ff.flows}
        target = db or ff.ledger
    if not target and os.environ.get(ENV_DB):
        target = as_target(os.environ[ENV_DB], ENV_DB)
    if not target:
        raise UsageError("no ledger named: give --db PATH|URL or --flows FILE (or set EAI_MQ_DB)")
    return target, policies


def _open(target: Any, flow: str | None) -> Any:

    if flow is not None:
        check_flow_name(flow)
    return open_ledger(target, flow=flow or "default", create=False)


@click.group("ledger")
def ledger() -> None:
    """The ledger itself: what it holds (stats) and removing its old rows (prune).

    \b
    Example:
      onceq ledger stats --db ./q/ledger.db
      onceq ledger prune --older-than 30d --db ./q/ledger.db --dry-run
    """


@ledger.command()
@click.option(
    "--older-than",
    "older_than",
    metavar="DURATION",
    required=True,
    help="Remove the rows older than this (30d, 12h, 90m; a number is seconds).",
)
@click.option(
    "--flow",
    "flow_name",
    metavar="NAME",
    help="Only this flow's rows (default: every flow in the ledger).",
)
@click.option("--dry-run", is_flag=True, help="Count what would go; change nothing.")
@click.option(
    "--force",
    is_flag=True,
    help="Prune even with a window shorter than the flows' longest retry delay.",
)
@click.option(
    "--batch",
    default=1000,
    show_default=True,
    type=click.IntRange(1, 1_000_000),
    help="Rows per transaction: a consumer's commit waits for one batch at most.",
)
@_target_options
def prune(
    older_than: str,
    flow_name: str | None,
    dry_run: bool,
    force: bool,
    batch: int,
    db: Any,
    flow_file: Path | None,
    as_json: bool,
) -> None:
    """Remove the ledger rows older than a window, in small batches.

    Per flow (--flow NAME, or every flow): messages (processed_at), duplicates
    (seen_at), failures (at), replays (at) and finished dead-letter operations,
    each batch its own short transaction, so a consumer keeps running beside it.
    Kept even when old: the failures of a message whose newest failure is inside
    the window (its attempts), a replay while a failure of its message stays, a
    killed operation's audit, each table's newest row. Business tables (the
    presets' `processed`, an SQL effect's tables) are never touched.

    The window is the dedup horizon: a copy of a pruned message that arrives later
    takes effect again. A window shorter than the longest retry delay of the flows
    in question is refused (exit 2, nothing removed) unless --force: the --flows
    file's retry policies, the default's 10 min for a flow it does not name.

    \b
    Example:
      onceq ledger prune --older-than 30d --db ./q/ledger.db --dry-run
      onceq ledger prune --older-than 30d --db ./q/ledger.db
      onceq ledger prune --older-than 90d --flows flows.toml --flow invoices --json
      onceq ledger prune --older-than 30d --db postgresql://onceq@db.example/app
    """
    from datetime import UTC, datetime

    window = parse_duration(older_than, "--older-than")
    target, policies = _resolve(db, flow_file)
    now = datetime.now(UTC)
    with _open(target, flow_name) as led, _Progress(sys.stderr) as progress:
        removed = prune_rows(
            led,
            window,
            flows=None if flow_name is None else [flow_name],
            dry_run=dry_run,
            batch=batch,
            policies=policies,
            force=force,
            now=now,
            progress=progress.update,
        )
    total = sum(n for per in removed.values() for n in per.values())
    result = {
        "ledger": describe(target),
        "older_than_s": window,
        "before": cutoff_of(window, now),
        "dry_run": dry_run,
        "removed": removed,
        "total": total,
    }
    if as_json:
        emit_json(result)
        return
    _print_prune(result)


def _print_prune(result: dict[str, Any]) -> None:
    from rich.table import Table

    verb = "would remove" if result["dry_run"] else "removed"
    out = console()
    out.print(
        f"{result['ledger']}: {verb} {result['total']} rows older than {result['before']}",
        markup=False,
    )
    table = Table("table", "flow", "rows", box=None, pad_edge=False)
    for name, per_flow in result["removed"].items():
        for flow, n in per_flow.items():
            table.add_row(name, flow, str(n))
    if table.row_count:
        out.print(table)


class _Progress:
    """One status line on a terminal's stderr while prune works: the table, the flow,
    the rows removed so far. Nothing when stderr is not a terminal."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.live = stream.isatty()
        self.started = time.monotonic()
        self.drawn = 0.0

    def __enter__(self) -> _Progress:
        return self

    def update(self, table: str, flow: str, removed: int) -> None:
        now = time.monotonic()
        if not self.live or now - self.drawn < REFRESH:
            return
        self.drawn = now
        line = f"pruning {table} of flow {flow}: {removed} removed · {now - self.started:.0f}s"
        self.stream.write(CLEAR + line)
        self.stream.flush()

    def __exit__(self, *exc: object) -> None:
        if self.live and self.drawn:
            self.stream.write(CLEAR)
            self.stream.flush()


@ledger.command()
@_target_options
def stats(db: Any, flow_file: Path | None, as_json: bool) -> None:
    """What the ledger holds: rows and the oldest row per table and flow, its size.

    The size is the SQLite file and its -wal, or on PostgreSQL the ledger tables'
    pg_total_relation_size (rows, indexes, TOAST). Changes nothing.

    \b
    Example:
      onceq ledger stats --db ./q/ledger.db
      onceq ledger stats --flows flows.toml --json
    """

    target, _ = _resolve(db, flow_file)
    with _open(target, None) as led:
        result = ledger_stats(led)
    if as_json:
        emit_json(result)
        return
    from rich.table import Table

    out = console()
    parts = ", ".join(f"{k} {v}" for k, v in result["size"].items())
    out.print(
        f"{result['ledger']} ({result['kind']}): {result['size_bytes']} bytes ({parts})",
        markup=False,
    )
    table = Table("table", "flow", "rows", "oldest", box=None, pad_edge=False)
    for name, t in result["tables"].items():
        table.add_row(name, "(all)", str(t["rows"]), t["oldest"] or "-")
        for flow, f in t["flows"].items():
            table.add_row(name, flow, str(f["rows"]), f["oldest"] or "-")
    out.print(table)
