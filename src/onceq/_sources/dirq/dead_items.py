"""A directory queue's dead letters (the files in error/) in the console's shape.

Listing reads error/ and the ledger as `dirq dead list` does (`dead.dead_files`); a
purge deletes files from error/ with the audit `mq dead purge` keeps; a replay is
`dirq replay`'s (`dead.check_replayable`, then `dead.replay_files`: the audit
row, the ledger reset, link into inbox/, unlink from error/), so the console and the
command cannot differ. A file is selected by its name: a name is unique in error/,
an id is not (a re-sent copy that died too). The selection is matched against
error/ as it is when the action runs: a file already replayed is no longer there,
so a second click replays nothing.
"""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime
from typing import Any

from onceq._sources.dead_api import DeadAction, DeadItem, DeadSelection
from onceq._sources.dirq.dead import DeadFile, check_replayable, dead_files, replay_files
from onceq._sources.dirq.files import fsync_dir
from onceq._sources.dirq.queue import DirQueue
from onceq.errors import UsageError

__all__ = ["items", "purge", "replay"]


def items(
    queue: DirQueue, ledger: Any, selection: DeadSelection, *, bodies: bool = False
) -> list[DeadItem]:
    """The files in error/ the selection matches (name order), with their bodies if asked."""
    out = []
    for f in dead_files(queue, ledger):
        item = _item(queue, f, bodies)
        if item is not None and selection.matches(item):
            out.append(item)
    return out


def replay(queue: DirQueue, ledger: Any, selection: DeadSelection) -> DeadAction:
    """Move the selected files back to inbox/, audited: the same steps as `dirq replay`."""
    result = DeadAction("replay")
    files = [f for f in dead_files(queue, ledger) if selection.matches(_light(f))]
    result.matched = len(files)
    if not files:
        return result
    check_replayable(queue, files)  # a refusal (Conflict, UsageError) changes nothing
    result.op = replay_files(queue, ledger, files, selection.as_filter())
    result.done = len(files)
    return result


def purge(
    queue: DirQueue, ledger: Any, selection: DeadSelection, via: str = "console"
) -> DeadAction:
    """Delete the selected files from error/, audited as `mq dead purge` is: the audit
    row first, then the ids (the msg_id, or the file name of one that never parsed)
    recorded BEFORE any file goes — a killed purge may list a file still there, never
    remove an unlisted one — then the unlinks and one fsync of error/. Something in
    error/ that is not a regular file (a folder, a link) refuses the whole purge first:
    deleting it is a person's decision, and a refusal must change nothing."""
    result = DeadAction("purge")
    files = [f for f in dead_files(queue, ledger) if selection.matches(_light(f))]
    result.matched = len(files)
    if not files:
        return result
    error = queue.folder("error")
    for f in files:
        try:
            regular = stat.S_ISREG(os.lstat(error / f.file).st_mode)
        except FileNotFoundError:
            continue  # gone since it was listed: skipped below
        if not regular:
            raise UsageError(
                f"{error / f.file}: not a regular file; remove it by hand (nothing purged)"
            )
    result.op = ledger.start_op("dirq", "purge", selection.as_filter(via), str(queue.root))
    try:
        ledger.record_purged(result.op, [f.msg_id or f.file for f in files])
        for f in files:
            try:
                os.unlink(error / f.file)
            except FileNotFoundError:
                result.skipped.append((f.file, "gone from error/ since it was listed"))
                continue
            result.done += 1
        fsync_dir(error)
    finally:
        ledger.finish_op(result.op)
    return result


def _light(f: DeadFile) -> DeadItem:
    """The item without a stat: what a selection matches on (key and reason)."""
    return DeadItem(f.file, f.msg_id, f.reason, f.detail or None, f.attempts, f.at, 0, "error/")


def _item(queue: DirQueue, f: DeadFile, bodies: bool) -> DeadItem | None:
    path = queue.folder("error") / f.file
    try:
        st = os.lstat(path)
        body = path.read_bytes() if bodies else None
    except FileNotFoundError:
        return None  # replayed or moved by hand since the listing
    item = _light(f)
    item.size = st.st_size
    item.body = body
    item.properties = {
        "file": f.file,
        "folder": str(queue.folder("error")),
        "modified": datetime.fromtimestamp(st.st_mtime, UTC).isoformat(timespec="seconds"),
    }
    return item
