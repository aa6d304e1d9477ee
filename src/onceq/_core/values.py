"""What the ledger can store, checked before a value reaches a commit.

SQLite's INTEGER is a signed 64-bit number: Python's sqlite3 raises OverflowError
binding a larger int. Its TEXT is UTF-8: a str holding a lone surrogate raises
UnicodeEncodeError. Such a str is easy to get: "\\ud800" is a legal JSON escape,
and a file name that is not UTF-8 comes back from os.listdir with its bytes as
surrogates. Both errors are raised while binding, for the whole group being
committed, so one message would stop the run and keep the innocent rest of its
group unsettled. The decoders refuse such values (this message's verdict); the
ledger checks again (`unstorable`), and stores refs and failure texts through
`text`, which cannot fail.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# C0 controls and DEL: not in an HTTP header value (aiohttp refuses CR/LF), not in a
# message id, escaped wherever a name is shown on one line.
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def fits_int64(value: int) -> bool:
    return INT64_MIN <= value <= INT64_MAX


def is_utf8(value: str) -> bool:
    """Can `value` be stored as TEXT (no lone surrogate)?"""
    if value.isascii():  # the common case, without encoding anything
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def text(value: Any) -> Any:
    """`value` as storable TEXT: each lone surrogate written as its escape (\\udcff),
    each NUL as \\x00.

    One fixed mapping, applied to a ref wherever it is written or looked up, so a file
    whose name is not UTF-8 is recorded, found again on recovery and reported like
    any other (its name in the ledger reads with the escape).
    """
    if not isinstance(value, str):
        return value  # not a str (None, a number): bound as it is
    if "\x00" in value:
        # PostgreSQL's TEXT cannot hold NUL (SQLite's can): written as its escape on
        # both, so a ref or failure text reads and is found again the same on either.
        value = value.replace("\x00", "\\x00")
    if is_utf8(value):
        return value
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def unstorable(value: Any) -> str | None:
    """Why SQLite cannot store `value` as a bound parameter, or None when it can."""
    if value is None or isinstance(value, float | bytes):
        return None
    if isinstance(value, int):
        return None if fits_int64(value) else "integer outside the 64-bit range"
    if isinstance(value, str):
        return None if is_utf8(value) else "text with a lone surrogate"
    return f"a {type(value).__name__} is not a storable value"


def is_data_error(exc: BaseException | None) -> bool:
    """Did binding one row's values fail (the row's fault), not the database?

    Disk, lock, I/O and schema errors are the ledger's: they must stop the run (exit
    8) with the group unsettled, never quarantine the messages that met them.
    None (a LedgerError without a cause) is not a data error.
    """
    if isinstance(exc, OverflowError | UnicodeEncodeError | sqlite3.DataError):
        return True
    return isinstance(exc, sqlite3.ProgrammingError | sqlite3.InterfaceError) and (
        "binding parameter" in str(exc)
    )
