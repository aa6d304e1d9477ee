"""`--db`: the one spelling of a ledger on every command, an SQLite path or a URL.

click.Path would turn `postgresql://u:pw@h/db` into `postgresql:/u:pw@h/db` (a Path
folds `//`) and click would quote it, password and all, in its own errors. This type
keeps a URL a str, checked (`onceq._ledger.target.as_target`), and gives a path
click.Path's checks (a folder in its place is refused, exit 2).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from onceq._ledger.target import as_target

DB_METAVAR = "PATH|URL"


class LedgerTargetType(click.ParamType):
    """A ledger: a path (an SQLite file) or a postgresql:// URL (a shared ledger)."""

    name = "ledger"
    _path = click.Path(path_type=Path, dir_okay=False)

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:

        if isinstance(value, Path):
            return value
        flag = f"--{param.name}" if param is not None and param.name else "--db"
        # A refusal is our UsageError (exit 2, one masked line), not click's BadParameter,
        # whose text would quote the raw value.
        target = as_target(value, flag)
        if isinstance(target, Path):
            return self._path.convert(target, param, ctx)
        return target


LEDGER_TARGET = LedgerTargetType()


def db_option(help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--db PATH|URL with `help`; the value is a Path or a postgresql:// URL (str)."""
    return click.option("--db", type=LEDGER_TARGET, metavar=DB_METAVAR, help=help)
