"""Where a ledger lives: an SQLite file, or a PostgreSQL database named by URL.

Every command that takes `--db` (and `EAI_MQ_DB`, and a flow file's `ledger = …`)
takes either: a path is an SQLite ledger (`onceq.ledger.Ledger`), a URL whose scheme
is `postgresql` or `postgres` is a shared PostgreSQL ledger (`onceq.pg.ledger.PgLedger`)
with the same contract. `open_ledger` is the one place that tells them apart, so no
caller branches on the kind of ledger.

A URL's password never reaches output: `describe` is what a message names, and the
URL's secrets are remembered (`onceq.redact.remember`) so that any text quoting them
(a driver's exception) is masked on the way out.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceq.redact import redact_url, remember

if TYPE_CHECKING:
    from onceq.effect import SqlEffect

PG_SCHEMES = ("postgresql", "postgres")
DEFAULT_FLOW = "default"


def is_pg_url(target: str | Path | None) -> bool:
    """Is `target` a PostgreSQL URL (scheme postgresql:// or postgres://)?"""
    if target is None or isinstance(target, Path):
        return False
    head, sep, _ = str(target).partition("://")
    return bool(sep) and head.lower() in PG_SCHEMES


def describe(target: str | Path) -> str:
    """`target` as a message may name it: a URL's password masked, a path as it is."""
    return redact_url(str(target)) if is_pg_url(target) else str(target)


def open_ledger(
    target: str | Path,
    source: str = "dirq",
    *,
    flow: str = DEFAULT_FLOW,
    sql: SqlEffect | None = None,
    create: bool = True,
) -> Any:
    """The ledger at `target` for `flow`: `Ledger` for a path, `PgLedger` for a URL.

    Same arguments and the same contract on both (the contract suite,
    tests/contract/test_ledger_contract.py, runs against each): `create=False` makes a
    missing ledger NotFound; `created` says this open made its tables.
    """
    if is_pg_url(target):
        remember(str(target))
        from onceq.pg.ledger import PgLedger

        return PgLedger(str(target), source, flow=flow, sql=sql, create=create)
    from onceq.ledger import Ledger

    return Ledger(target, source, flow=flow, sql=sql, create=create)
