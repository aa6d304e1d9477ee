"""The directory queue's metrics reader: counts and the oldest file's age, cheaply.

A standing backlog must not be stat'ed again at every scan (10,000 stats cost a
directory queue 12 % of its rate in bench/metrics_cost.py): only names not seen
before are; and the figures must still be those of the folder.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from onceq._sources.dirq.queue import DirQueue
from onceq._sources.dirq.scan import DirScan


def _queue(tmp_path: Path, n: int) -> Path:
    root = tmp_path / "q"
    DirQueue(root).init(None)
    for i in range(n):
        f = root / "inbox" / f"m-{i:03}.json"
        f.write_text("{}")
        os.utime(f, (1000.0 + i, 1000.0 + i))  # m-000 is the oldest
    return root


def test_a_standing_backlog_is_listed_not_stated_again(tmp_path: Path) -> None:
    root = _queue(tmp_path, 50)
    scan = DirScan(root)
    assert scan.oldest_age() is None  # never read: no figure, not a false 0
    scan.scan()
    assert scan.stats == 50
    assert scan.messages() == {"inbox": 50, "processing": 0, "retry": 0, "error": 0}
    scan.scan()
    assert scan.stats == 50  # nothing new: not one stat
    assert scan.messages()["inbox"] == 50


def test_new_and_gone_files_keep_the_figures_true(tmp_path: Path) -> None:
    root = _queue(tmp_path, 5)
    scan = DirScan(root)
    scan.scan()
    age = scan.oldest_age()
    assert age is not None and abs(age - (time.time() - 1000.0)) < 5
    (root / "inbox" / "m-000.json").unlink()  # the oldest is claimed
    new = root / "inbox" / "n-1.json"
    new.write_text("{}")
    scan.scan()
    assert scan.stats == 6  # only the new name was stat'ed
    assert scan.messages()["inbox"] == 5
    age = scan.oldest_age()
    assert age is not None and abs(age - (time.time() - 1001.0)) < 5  # m-001 now
    for f in (root / "inbox").iterdir():
        f.unlink()
    scan.scan()
    assert scan.messages()["inbox"] == 0
    assert scan.oldest_age() == 0.0


def test_a_vanished_folder_keeps_the_last_figures(tmp_path: Path) -> None:
    root = _queue(tmp_path, 3)
    scan = DirScan(root)
    scan.scan()
    for f in (root / "inbox").iterdir():
        f.unlink()
    (root / "inbox").rmdir()
    scan.scan()
    assert scan.error is not None
    assert scan.messages()["inbox"] == 3
