"""Where a ledger lives: an SQLite file, or a PostgreSQL database named by URL.

Every command that takes `--db` (and `EAI_MQ_DB`, and a flow file's `ledger = …`)
takes either: a path is an SQLite ledger (`onceq._ledger.sqlite.Ledger`), a URL whose scheme
is `postgresql` or `postgres` is a shared PostgreSQL ledger (`onceq._ledger.pg.ledger.PgLedger`)
with the same contract. `open_ledger` is the one place that tells them apart, so no
caller branches on the kind of ledger.

A URL's password never reaches output: `describe` is what a message names, and the
URL's secrets are remembered (`onceq._core.redact.remember`) so that any text quoting them
(a driver's exception) is masked on the way out.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from onceq._core.redact import redact_text, redact_url, remember, remember_secret, userinfo_password
from onceq.errors import UsageError

if TYPE_CHECKING:
    from onceq._core.effect import SqlEffect
    from onceq._core.ledger_api import LedgerApi
    from onceq._ledger.ops import Queries
    from onceq._ledger.pg.ledger import PgLedger
    from onceq._ledger.sqlite import Ledger

    def _both_kinds_conform(
        a: Ledger, b: PgLedger
    ) -> tuple[LedgerApi, LedgerApi, Queries, Queries]:
        """For mypy only: what open_ledger returns meets the loop's protocol and the
        shared query interface, whichever kind it is."""
        return a, b, a, b


PG_SCHEMES = ("postgresql", "postgres")
DEFAULT_FLOW = "default"
Target = str | Path  # a URL stays a str (never a Path: Path() would fold its `//`)

# A value that was meant as a PostgreSQL URL but is not one (`postgresql//…`,
# `postgres:/…`, `PostgreSQL:…`): taken as a path it would name a folder that does not
# exist, and the refusal would print the "path" — the password with it.
_MISTYPED_PG = re.compile(r"\s*postgres(?:ql)?\s*[:/;\\]", re.IGNORECASE)
# Any other `scheme://` is no ledger onceq knows (mysql://, sqlite://, http://).
_OTHER_SCHEME = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.\-]*:/{2}")


def is_pg_url(target: str | Path | None) -> bool:
    """Is `target` a PostgreSQL URL (scheme postgresql:// or postgres://)?"""
    if target is None or isinstance(target, Path):
        return False
    head, sep, _ = str(target).partition("://")
    return bool(sep) and head.lower() in PG_SCHEMES


def describe(target: str | Path) -> str:
    """`target` as a message may name it: a URL's password masked, a path as it is."""
    return redact_url(str(target)) if is_pg_url(target) else str(target)


def as_target(value: str | Path, what: str = "--db") -> Target:
    """A ledger named by a user (`--db`, EAI_MQ_DB, a flow file's `ledger`): a checked
    PostgreSQL URL (a str), else a Path. UsageError (exit 2, one masked line naming
    `what`) for a URL that cannot be parsed, or a value that is a URL of another kind.

    The URL's password is remembered (masked in all later output) before anything
    can print it: the checks here, a driver's error text, a traceback.
    """
    if isinstance(value, Path):
        return value
    text = str(value)
    if is_pg_url(text):
        check_pg_url(text, what)
        return text
    # The last test: a "path" that holds userinfo (`//u:pw@h/db`, `u:pw@h/db`) is a URL
    # whose scheme was lost, not a file name; as a path it would be printed as it is.
    if _MISTYPED_PG.match(text) or _OTHER_SCHEME.match(text) or redact_url(text) != text:
        remember(text)
        raise UsageError(
            # No '@' in the hint: the masking of stderr runs to the line's last '@'.
            f"{what} {redact_url(text)}: not a ledger path nor a postgresql:// URL"
            " (a shared ledger's URL starts with postgresql:// or postgres://)"
        )
    return Path(text)


def check_pg_url(url: str, what: str = "--db") -> dict[str, str]:
    """The connection parameters of `url` as libpq reads them (psycopg's
    `conninfo_to_dict`), or UsageError naming `what` and why, the password masked.

    Checked before any connection, so that a typo is exit 2 (bad usage), not a
    connection failure (exit 8) after a timeout. libpq's own reason quotes the
    offending piece of the URL ("p w", the password itself): what it quotes is left
    out of the line, since a mistyped URL splits where no masking rule expects.
    """
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    remember(url)
    shown = redact_url(url)
    try:
        params = {k: str(v) for k, v in conninfo_to_dict(url).items()}
    except ProgrammingError as exc:
        # From the first quote to the last: the piece may hold quotes itself.
        why = re.sub(r'".*"', '"…"', " ".join(str(exc).split()))
        raise UsageError(
            f"{what} {shown}: not a valid PostgreSQL URL: {redact_text(why)}"
        ) from None
    except UnicodeDecodeError:  # psycopg decodes libpq's values: `%aa` is no UTF-8
        raise UsageError(
            f"{what} {shown}: not a valid PostgreSQL URL: a percent-encoded part is not UTF-8"
        ) from None
    # libpq splits userinfo at the FIRST '@', the masking rule at the last: with an
    # unencoded '@' or '/' in a password they disagree, libpq takes the rest of the
    # password for a host or a database, and its errors ("failed to resolve host
    # 'pw…'") would print it. Refused unless both read the same password.
    masked = userinfo_password(url)
    if masked is not None and unquote(masked) != params.get("password", ""):
        raise UsageError(
            # No '@' in the line: the masking of stderr runs to the line's last '@'.
            f"{what} {shown}: not a valid PostgreSQL URL: the password must percent-encode"
            " at-signs, slashes, '?', '#' and '%' (as %40, %2F, %3F, %23, %25)"
        )
    if params.get("password"):
        remember_secret(params["password"])  # as libpq reads it (`?password=…` too)
    for port in params.get("port", "").split(","):
        if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise UsageError(f"{what} {shown}: not a valid PostgreSQL URL: the port is not 1-65535")
    return params


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
    target = as_target(target, "ledger")  # a library caller's str too: checked, remembered
    if is_pg_url(target):
        from onceq._ledger.pg.ledger import PgLedger  # why: psycopg costs start-up (SQLite runs)

        return PgLedger(str(target), source, flow=flow, sql=sql, create=create)
    from onceq._ledger.sqlite import Ledger  # why: --db parsing (cli) must not load a ledger

    return Ledger(target, source, flow=flow, sql=sql, create=create)
