"""A consumer's moves run behind the committer, one group at a time, errors never lost.

`Worker.settle` hands a group's moves to its `Mover` (onceq._sources.dirq.files) and
returns, so the next commit runs while they happen. What must hold: a group's moves
start only after the previous group's have ended, in order; a file stays claimed
(in processing/, its name held) until its own move is done; a failed move stops the
run — raised by the next settle, by `moved()`, by the iteration waiting for those
files, or by `close()` when nothing else asked — and is raised once.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from onceq._core.transport import Settle
from onceq._sources.dirq.queue import DirQueue
from onceq._sources.dirq.worker import Worker
from onceq.errors import QueueError


def _queue(tmp_path: Path, n: int) -> DirQueue:
    q = DirQueue(tmp_path / "q")
    q.init()
    for i in range(n):
        (q.folder("inbox") / f"m-{i}.json").write_text(f'{{"msg_id": "m-{i}"}}')
    return q


def test_groups_move_one_at_a_time_in_order(tmp_path: Path) -> None:
    q = _queue(tmp_path, 0)
    spans: list[tuple[str, float, float]] = []
    go = threading.Event()

    def move(name: str) -> float:
        t0 = time.monotonic()
        if name == "c":
            go.wait(10)
        time.sleep(0.02)
        spans.append((name, t0, time.monotonic()))
        return 0.0

    async def main() -> list[str]:
        with Worker(q) as w:
            assert w._mover is not None
            w._mover._move = move
            await w.settle("a")  # type: ignore[arg-type]
            await w.settle("b")  # type: ignore[arg-type]  # waits for a's moves first
            await w.settle("c")  # type: ignore[arg-type]  # handed over, not waited for
            before = [n for n, _, _ in spans]
            go.set()
            await w.moved()
            return before

    assert asyncio.run(main()) == ["a", "b"]  # each settle waited for the group before
    assert [n for n, _, _ in spans] == ["a", "b", "c"]
    for (_, _, end), (_, start, _) in itertools.pairwise(spans):
        assert start >= end  # never two groups moving at once


def test_a_failed_move_is_raised_by_the_next_settle_and_only_once(tmp_path: Path) -> None:
    q = _queue(tmp_path, 0)
    w = Worker(q).open()

    def move(group: str) -> float:
        if group == "bad":
            raise QueueError("done: cannot move m-1.json there: No space left on device")
        return 0.0

    async def main() -> None:
        assert w._mover is not None
        w._mover._move = move
        await w.settle("bad")  # type: ignore[arg-type]
        with pytest.raises(QueueError, match="No space left"):
            await w.settle("next")  # type: ignore[arg-type]  # its claims stay claimed

    asyncio.run(main())
    w.close()  # raised already: not a second time


def test_a_last_failed_move_nobody_asked_about_is_raised_by_close(tmp_path: Path) -> None:
    q = _queue(tmp_path, 2)
    w = Worker(q)

    def fail(group: Any) -> float:
        raise QueueError("done: cannot move there: Read-only file system")

    w._move_group = fail  # type: ignore[method-assign]  # before open(): the mover's
    w.open()

    async def main() -> None:
        it = w.deliveries()
        d = await it.__anext__()
        await w.settle([(d, Settle.ACK, "")])  # handed over: returns at once
        await it.aclose()

    asyncio.run(main())
    with pytest.raises(QueueError, match="Read-only"):
        w.close()
    assert sorted(p.name for p in w.dir.iterdir() if p.suffix == ".json") == ["m-0.json"]


def test_a_file_stays_claimed_until_its_own_move_is_done(tmp_path: Path) -> None:
    q = _queue(tmp_path, 1)
    release = threading.Event()

    async def main() -> None:
        with Worker(q) as w:
            real = w._move_group

            def slow(group: Any) -> float:
                release.wait(10)
                return real(group)

            assert w._mover is not None
            w._mover._move = slow  # the committer's next commit would run meanwhile
            it = w.deliveries()
            d = await it.__anext__()
            await w.settle([(d, Settle.ACK, "")])
            # Settled for the loop, still claimed on disk and in memory: a file of
            # the same name in the inbox is not claimed over it.
            assert (w.dir / "m-0.json").exists() and not (q.folder("done") / "m-0.json").exists()
            assert "m-0.json" in w._held
            release.set()
            await asyncio.wait_for(w.moved(), 10)
            assert (q.folder("done") / "m-0.json").exists() and not (w.dir / "m-0.json").exists()
            assert [x async for x in it] == []  # nothing held: the iteration ends

    asyncio.run(main())


def test_close_leaves_its_empty_folder_to_a_recovery_that_removed_it_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between our lock file's unlink and our rmdir, another consumer's recovery may take
    the lockless folder for a stray one and remove it (takeover._take_over): close()
    must not fail on it (seen once in CI as a worker's FileNotFoundError, exit 1)."""
    import os

    from onceq._sources.dirq import worker as worker_mod

    q = _queue(tmp_path, 0)
    w = Worker(q).open()
    real_unlink = os.unlink

    def unlink_then_another_removes(path: Any, *args: Any, **kwargs: Any) -> None:
        real_unlink(path, *args, **kwargs)
        if str(path).endswith("/.lock") and Path(path).parent == w.dir:
            os.rmdir(w.dir)  # what the other consumer's recovery does

    monkeypatch.setattr(worker_mod.os, "unlink", unlink_then_another_removes)
    w.close()
    monkeypatch.undo()
    assert not w.dir.exists()


@pytest.mark.parametrize("when", ["before-its-lock-is-opened", "before-its-lock-is-taken"])
def test_recovery_takes_nothing_from_a_folder_removed_while_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """The other side of the race above: a starting consumer's recovery lists
    processing/, and the folder it looks at is removed before it reads it, by its
    owner's close() (unlink .lock, rmdir, then free the lock) or by a second recovering
    consumer. Seen in a README run of `dirq consume --workers 2`: the worker stopped
    with FileNotFoundError: 'pgq/processing/w-…' (exit 1). A folder is only removed
    empty, so the recovery takes nothing and goes on."""
    import fcntl
    import os

    from onceq._sources.dirq import takeover

    q = _queue(tmp_path, 0)
    other = Worker(q).open()
    gone = other.dir
    real_open, real_flock = takeover.os.open, takeover.fcntl.flock

    def open_after_the_owner_ended(path: Any, *args: Any, **kwargs: Any) -> int:
        if Path(path) == gone / ".lock":
            other.close()  # so the recovery finds no lock file, then no folder
        return real_open(path, *args, **kwargs)

    def flock_after_the_owner_ended(fd: int, op: int) -> None:
        if op & fcntl.LOCK_NB and gone.exists():
            other.close()  # it had the lock file open; the lock is free once it ends
        real_flock(fd, op)

    if when == "before-its-lock-is-opened":
        monkeypatch.setattr(takeover.os, "open", open_after_the_owner_ended)
    else:
        monkeypatch.setattr(takeover.fcntl, "flock", flock_after_the_owner_ended)
    with Worker(q) as w:
        assert not gone.exists()
        assert w.dir.exists()
        assert os.listdir(q.folder("processing")) == [w.dir.name]
    assert os.listdir(q.folder("processing")) == []
