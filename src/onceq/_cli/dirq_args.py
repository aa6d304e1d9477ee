"""The arguments every dirq command shares: QDIR, --db's help, --required.

A module of its own so that `dirq consume` (the hot command) does not import the
report, schema and order-check commands, and what they load, to read three constants.
"""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["DB_HELP", "DEFAULT_REQUIRED", "QDIR", "READ_FLOW_HELP", "parse_required"]

# A QDIR that is missing, or a file, is "not a queue": exit 3 from DirQueue.check(),
# the same in every command (click's own file_okay check would make a file exit 2).
QDIR = click.Path(path_type=Path)
DEFAULT_REQUIRED = "msg_id,order_no,seq,amount"
DB_HELP = (
    "Ledger: an SQLite file (default: QDIR/ledger.db; its folder must exist) or a"
    " postgresql://USER:PASSWORD@HOST:PORT/DATABASE URL (a shared ledger)."
)
READ_FLOW_HELP = "The flow whose rows to read (dirq consume --flow, a flow file's [flows.NAME])."


def parse_required(value: str) -> tuple[str, ...]:
    """`--required a,b,c` as a tuple; naming no field is a usage error (exit 2)."""
    fields = tuple(f.strip() for f in value.split(",") if f.strip())
    if not fields:
        raise click.BadParameter(f"{value!r} names no field", param_hint="'--required'")
    return fields
