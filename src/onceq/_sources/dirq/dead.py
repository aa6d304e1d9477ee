"""A directory queue's dead letters: the files in error/, listed and replayed in bulk.

    onceq dirq dead list QDIR [--reason R]      error/'s files with the ledger's word
    onceq dirq replay QDIR (--all | --reason R) error/ → inbox/, audited

What a file in error/ died of comes from the ledger (its newest failure, by file
name; a clash name NAME.1 failed as NAME), so the list and the report agree, and a
file the ledger knows nothing of is `unknown`.

A bulk replay checks everything before it changes anything (every matching file
is a plain file, none has a namesake in inbox/), so a refusal leaves the folders
and the ledger as they were. Then, in this order:
1. `start_op` writes the audit row (dead_ops): even a killed replay is on record;
2. `record_replays` writes every replay row (their attempts start again) and the
   op's count in one transaction, BEFORE any file is back in the inbox: a consumer
   that claims one at once must find its attempts reset, never the old count;
3. each file is linked into inbox/ (never replacing one), inbox/ is fsynced once,
   then the error/ names are unlinked and error/ is fsynced;
4. `finish_op` stamps the audit row.
A kill anywhere leaves each file in error/, in inbox/, or (between 3's link and
unlink) in both: the inbox copy is consumed, the error/ one stays quarantined, and
a later replay of it is a duplicate in the ledger. Never lost, never applied twice.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onceq._core import faults
from onceq._sources.dirq.files import fsync_dir, is_message_name
from onceq._sources.dirq.queue import DirQueue
from onceq.errors import Conflict, NotFound, UsageError

if TYPE_CHECKING:
    from onceq._ledger.sqlite import Ledger

UNKNOWN = "unknown"
# move_no_clobber names a second file of the same name NAME.1, NAME.2 …
_CLASH_SUFFIX = re.compile(r"^(?P<name>.+)\.[1-9][0-9]*$")


@dataclass
class DeadFile:
    """One file in error/ and what the ledger says about it."""

    file: str
    msg_id: str | None = None
    reason: str = UNKNOWN
    detail: str = ""
    attempts: int = 0
    at: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "msg_id": self.msg_id,
            "reason": self.reason,
            "detail": self.detail,
            "attempts": self.attempts,
            "at": self.at,
        }


def dead_files(queue: DirQueue, ledger: Ledger, reason: str | None = None) -> list[DeadFile]:
    """The files in error/ (name order) with their reason, detail, attempts and time;
    only those whose reason is `reason` when it is given."""
    queue.check()
    names = sorted(n for n in os.listdir(queue.folder("error")) if is_message_name(n))
    # The newest dead failure of each file name (dead_letters is oldest first).
    by_ref: dict[str, dict[str, Any]] = {}
    for dead in ledger.dead_letters():
        by_ref[dead["ref"]] = dead
    out = []
    for name in names:
        row = by_ref.get(name)
        if row is None and (m := _CLASH_SUFFIX.match(name)):
            row = by_ref.get(m.group("name"))
        f = DeadFile(name)
        if row is not None:
            f.msg_id, f.reason, f.detail, f.at = (
                row["msg_id"],
                row["reason"],
                row["detail"],
                row["at"],
            )
        out.append(f)
    ids = [f.msg_id for f in out if f.msg_id is not None]
    info = ledger.dead_info(ids)
    for f in out:
        if f.msg_id in info:
            f.attempts = info[f.msg_id]["attempts"]
        elif f.at is not None:
            f.attempts = 1  # no msg_id (it never parsed): its one try
    if reason is not None:
        out = [f for f in out if f.reason == reason]
    return out


def check_replayable(queue: DirQueue, files: list[DeadFile]) -> None:
    """Refuse (changing nothing) unless every file can go back to the inbox as it is."""
    for f in files:
        src = queue.folder("error") / f.file
        st = os.lstat(src)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{src}: not a regular file; move it by hand (nothing replayed)")
        if os.path.lexists(queue.folder("inbox") / f.file):
            raise Conflict(
                f"{queue.folder('inbox') / f.file}: already in the inbox (nothing replayed)"
            )


def select(
    queue: DirQueue, ledger: Ledger, *, everything: bool, reason: str | None
) -> list[DeadFile]:
    """The files a bulk replay would move, checked; NotFound when there are none."""
    files = dead_files(queue, ledger, None if everything else reason)
    if not files:
        what = "no file in error/" if everything else f"no file in error/ with reason {reason!r}"
        raise NotFound(f"{queue.folder('error')}: {what}; nothing to replay")
    check_replayable(queue, files)
    return files


def replay_files(
    queue: DirQueue,
    ledger: Ledger,
    files: list[DeadFile],
    filter: dict[str, Any],
) -> int:
    """Move `files` (from `select`) back to the inbox, audited (see the module); the
    op id."""
    op = ledger.start_op("dirq", "replay", filter, str(queue.root))
    ledger.record_replays(op, [(f.file, f.msg_id) for f in files])
    error, inbox = queue.folder("error"), queue.folder("inbox")
    linked = []
    for f in files:
        try:
            os.link(error / f.file, inbox / f.file)  # EEXIST refuses: never replaces
        except FileExistsError:
            continue  # a producer wrote this name since the check: it stays in error/
        linked.append(f.file)
        faults.hit("mid-replay")  # linked into inbox/, still in error/ too
    fsync_dir(inbox)  # the inbox names are durable before any error/ name goes
    for name in linked:
        os.unlink(error / name)
    fsync_dir(error)
    ledger.finish_op(op)
    return op
