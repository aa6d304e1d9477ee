"""dup.txt and error.csv, written from durable state (the ledger and error/).

Neither file is a log of one run: dup.txt lists every msg_id the ledger ever
recorded as an ignored duplicate, error.csv every file error/ holds now, with the
newest failure reason the ledger has for it. So two runs, or a run and a report
afterwards, write byte-identical files, and a crash between runs loses nothing.

Both are written atomically (a dot-named temporary file, fsync, rename): a reader
sees the old report or the new one, never half of one.
"""

from __future__ import annotations

import csv
import io
import os
import re
from pathlib import Path

from onceq._ledger.sqlite import Ledger
from onceq._sources.dirq.files import fsync_dir, is_message_name, write_atomic
from onceq._sources.dirq.queue import DirQueue

DUP_FILE = "dup.txt"
ERROR_FILE = "error.csv"
UNKNOWN = "unknown"

# move_no_clobber names a second file of the same name NAME.1, NAME.2 …
_CLASH_SUFFIX = re.compile(r"^(?P<name>.+)\.[1-9][0-9]*$")


def dup_text(ledger: Ledger) -> str:
    """Every msg_id ever ignored as a duplicate, ascending, one a line."""
    return "".join(f"{m}\n" for m in ledger.duplicate_ids())


def error_reason(ledger: Ledger, name: str) -> str:
    """The newest failure reason the ledger holds for the file error/NAME.

    A file quarantined under a clash name (NAME.1) failed as NAME: when the exact
    name has no record, the name without the clash suffix is tried.
    """
    found = ledger.last_failure(name)
    if found is None and (m := _CLASH_SUFFIX.match(name)):
        found = ledger.last_failure(m.group("name"))
    return UNKNOWN if found is None else found[0]


def error_rows(queue: DirQueue, ledger: Ledger) -> list[tuple[str, str]]:
    names = sorted(n for n in os.listdir(queue.folder("error")) if is_message_name(n))
    return [(n, error_reason(ledger, n)) for n in names]


def error_text(queue: DirQueue, ledger: Ledger) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(("file", "reason"))
    w.writerows(error_rows(queue, ledger))
    return buf.getvalue()


def write_report(queue: DirQueue, ledger: Ledger) -> tuple[Path, Path]:
    """Write QDIR/dup.txt and QDIR/error.csv; returns their paths."""
    queue.check()
    dup = write_atomic(queue.root, DUP_FILE, dup_text(ledger).encode())
    # A file name that is not UTF-8 (its bytes come back from listdir as surrogates)
    # is written escaped, as the ledger stores it, instead of failing the report.
    err = write_atomic(
        queue.root, ERROR_FILE, error_text(queue, ledger).encode("utf-8", "backslashreplace")
    )
    fsync_dir(queue.root)  # the renames themselves survive a power cut
    return dup, err
