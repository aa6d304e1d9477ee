"""`onceq trace ID`: one message's journey through every flow that holds it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from onceq._cli.db_option import db_option
from onceq._cli.flow_options import flow_names_option
from onceq._cli.output import console, emit_json
from onceq._cli.run import load_or_exit
from onceq._core.logs import setup as setup_logs
from onceq._ledger.target import describe
from onceq._ops.journey import Journey
from onceq._ops.journey import trace as read_journeys
from onceq._ops.ledger_read import NoLedger
from onceq.errors import NotFound

DEFAULT_FILE = "flows.toml"
# How each step reads on a terminal: (word, colour).
_LOOK = {
    "retry": ("retried", "yellow"),
    "delayed": ("delayed", "yellow"),
    "dead": ("dead", "red"),
    "replayed": ("replayed", "cyan"),
    "purged": ("purged", "magenta"),
    "duplicate": ("duplicate", "dim"),
    "done": ("done", "green"),
}


@click.command()
@click.argument("msg_id", metavar="ID")
@click.argument("file", required=False, type=click.Path(path_type=Path, dir_okay=False))
@flow_names_option("Only this flow (repeatable; default: every flow of the ledger holding ID).")
@db_option("Ledger to read (a path or a postgresql:// URL), instead of FILE's ledger.")
@click.option("--json", "as_json", is_flag=True, help="Print the journeys as JSON (stable keys).")
def trace(msg_id: str, file: Path | None, names: tuple[str, ...], db: Any, as_json: bool) -> None:
    """One message's journey from the ledger, in time order; nothing is written.

    Every attempt and its reason, delays, dead-lettering, replays and purges (with
    the operation's audit row), duplicates refused, and the final state. ID is the
    message's id (its id field or message_id), or the file name of a message that
    never parsed. FILE is a flow file (default ./flows.toml when it exists) whose
    ledger is read; --db names a ledger instead. Without --flow every flow holding
    ID is shown, each in time order. The ledger is opened read-only and never
    created; each lookup is an index seek, as fast on millions of rows as on a few.
    Exit 0 (shown); 2 a bad flow file or option; 3 no flow file (and no --db), no
    ledger there, or no flow holds ID; 8 the ledger cannot be read.

    \b
    Example:
      onceq trace INV-1001                       # ./flows.toml's ledger
      onceq trace INV-1001 --db ./q/ledger.db --json
      onceq trace 6f1c2a1e --flow claims --db postgresql://onceq@db/app
    """
    setup_logs()
    target = _ledger(file, names, db)
    try:
        journeys = read_journeys(target, msg_id, names)
    except NoLedger:
        raise NotFound(f"{describe(target)}: no onceq ledger there (nothing to trace)") from None
    if as_json:
        emit_json(
            {
                "id": msg_id,
                "ledger": describe(target),
                "journeys": [j.as_dict() for j in journeys],
            }
        )
    else:
        for j in journeys:
            _show(j)
    if not journeys:
        where = f"flow {', '.join(names)}" if names else "no flow"
        raise NotFound(f"{msg_id}: {where} of {describe(target)} holds this id")


def _ledger(file: Path | None, names: tuple[str, ...], db: Any) -> Any:
    if db is not None:
        return db
    if file is None:
        file = Path(DEFAULT_FILE)
        if not file.is_file():
            raise NotFound(
                f"no {DEFAULT_FILE} here: name a flow file (onceq trace ID FILE) or a ledger"
                " (--db PATH|URL)"
            )
    elif not file.exists():
        raise NotFound(f"{file}: no such flow file")
    return load_or_exit(file, names).ledger


def _show(j: Journey) -> None:
    from rich.table import Table
    from rich.text import Text

    out = console()
    state = _LOOK.get(j.state, (j.state, "bold"))
    title = Text.assemble(
        (j.flow, "bold"), " · ", j.msg_id or "(never parsed)", " · ", (state[0], state[1])
    )
    # Text, never markup: an id or a reason is the sender's text and may hold [brackets].
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for col in ("at (UTC)", "step", "attempt", "reason", "detail", "ref"):
        table.add_column(col, overflow="fold")
    for s in j.steps:
        word, colour = _LOOK.get(s.step, (s.step, ""))
        detail = s.detail or ""
        if s.delay_s is not None:
            detail = f"next try in {s.delay_s:g} s" + (f"; {detail}" if detail else "")
        if s.op is not None:
            detail = f"{s.op['op']} #{s.op['id']} ({s.op['count']} message(s))"
        table.add_row(
            Text(_short(s.at)),
            Text(word, style=colour),
            Text("" if s.attempt is None else str(s.attempt)),
            Text(s.reason or ""),
            Text(detail),
            Text(s.ref or ""),
        )
    out.print(table)
    if j.kept:
        out.print(Text("kept: " + ", ".join(f"{k}={v}" for k, v in j.kept.items())))
    out.print()


def _short(at: str) -> str:
    """2026-12-06T22:50:39.992079+00:00 → 2026-12-06 22:50:39.992 (the column says UTC)."""
    if len(at) >= 23 and at[10] == "T" and at.endswith("+00:00"):
        return f"{at[:10]} {at[11:23]}"
    return at
