"""The directory queue's Worker as a transport, driven directly on real folders:
pause/probe/resume, RELEASE back to the inbox, DELAY into retry/ with its due time,
and the recovery of a claim that a killed consumer had already linked into retry/."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from pathlib import Path

from dirq_retry_support import files, make_queue
from onceq._core.transport import Delivery, Settle
from onceq._sources.dirq.queue import DirQueue
from onceq._sources.dirq.worker import LOCK, Worker


async def _next(it, timeout: float = 5.0) -> Delivery:  # type: ignore[no-untyped-def]
    return await asyncio.wait_for(it.__anext__(), timeout)


def test_pause_waits_probe_hands_out_one_resume_the_rest(tmp_path: Path) -> None:
    q = make_queue(tmp_path, ["1", "2", "3"])

    async def main() -> None:
        with Worker(DirQueue(q)) as w:
            it = w.deliveries()
            d1 = await _next(it)
            w.pause()
            # Paused: nothing is claimed, and the iteration does not end either.
            pending = asyncio.ensure_future(it.__anext__())
            await asyncio.sleep(0.3)
            assert not pending.done()
            assert files(q, "inbox") == ["m-2.json", "m-3.json"]
            w.probe()
            d2 = await asyncio.wait_for(pending, 5)
            assert files(q, "inbox") == ["m-3.json"]  # exactly one more
            pending = asyncio.ensure_future(it.__anext__())
            await asyncio.sleep(0.3)
            assert not pending.done()  # one probe, one file
            w.resume()
            d3 = await asyncio.wait_for(pending, 5)
            assert [d.ref for d in (d1, d2, d3)] == ["m-1.json", "m-2.json", "m-3.json"]
            await w.settle([(d, Settle.ACK, "") for d in (d1, d2, d3)])
            # Nothing left, nothing held, no retry/: the iteration ends.
            await asyncio.wait_for(_drain(it), 5)

    asyncio.run(main())
    assert files(q, "done") == ["m-1.json", "m-2.json", "m-3.json"]


async def _drain(it) -> list[Delivery]:  # type: ignore[no-untyped-def]
    return [d async for d in it]


def test_release_goes_back_to_the_inbox_without_clobbering(tmp_path: Path) -> None:
    q = make_queue(tmp_path, ["1"])

    async def main() -> None:
        with Worker(DirQueue(q)) as w:
            it = w.deliveries()
            d = await _next(it)
            w.pause()  # so the released file is not claimed again at once
            # Meanwhile a producer sends another file under the same name.
            (q / "inbox" / "m-1.json").write_text('{"id": "other"}')
            await w.settle([(d, Settle.RELEASE, "")])
            await it.aclose()

    asyncio.run(main())
    assert files(q, "inbox") == ["m-1.json", "m-1.json.1"]
    assert (q / "inbox" / "m-1.json.1").read_text() == '{"id": "1"}'
    assert files(q, "processing") == [] and not (q / "retry").exists()


def test_delay_links_into_retry_with_its_due_time_and_waits_for_it(tmp_path: Path) -> None:
    q = make_queue(tmp_path, ["1"])

    async def main() -> None:
        with Worker(DirQueue(q)) as w:
            it = w.deliveries()
            d = await _next(it)
            d.delay = 0.8
            before = time.time()
            await w.settle([(d, Settle.DELAY, "http-503")])
            await w.moved()  # settle hands the moves to the mover thread
            st = os.stat(q / "retry" / "m-1.json")
            assert before + 0.8 <= st.st_mtime <= time.time() + 0.8
            again = await _next(it, 10)  # the iteration waited for it, did not end
            assert time.time() >= st.st_mtime
            assert again.ref == "m-1.json" and not again.redelivered
            await w.settle([(again, Settle.ACK, "")])
            assert await _drain(it) == []

    asyncio.run(main())
    assert files(q, "done") == ["m-1.json"] and files(q, "retry") == []


def _dead_claim(q: Path, name: str, also: Path) -> Path:
    """A killed consumer's folder holding `name`, hard-linked at `also` (its move out
    had linked and not unlinked)."""
    dead = q / "processing" / "w-1-dead00"
    dead.mkdir()
    (dead / LOCK).touch()
    os.link(also, dead / name)
    return dead


def test_a_dead_claim_already_in_retry_is_dropped_not_run_twice(tmp_path: Path) -> None:
    q = make_queue(tmp_path, [])
    (q / "retry").mkdir()
    waiting = q / "retry" / "m-1.json"
    waiting.write_text('{"id": "1"}')
    far = time.time() + 3600
    os.utime(waiting, (far, far))
    _dead_claim(q, "m-1.json", waiting)

    async def main() -> list[Delivery]:
        with Worker(DirQueue(q)) as w:
            it = w.deliveries()
            got = []
            # Nothing to hand out: the only copy waits in retry/ (due in an hour).
            with contextlib.suppress(TimeoutError):
                got.append(await asyncio.wait_for(it.__anext__(), 0.5))
            await it.aclose()
            return got

    assert asyncio.run(main()) == []
    assert files(q, "retry") == ["m-1.json"] and files(q, "processing") == []
    assert os.stat(waiting).st_nlink == 1


def test_a_dead_claim_linked_elsewhere_is_still_taken_over(tmp_path: Path) -> None:
    """A producer's hard link from outside the queue is not a move in progress."""
    q = make_queue(tmp_path, [])
    outside = tmp_path / "outside.json"
    outside.write_text('{"id": "1"}')
    _dead_claim(q, "m-1.json", outside)

    async def main() -> list[str]:
        with Worker(DirQueue(q)) as w:
            it = w.deliveries()
            d = await _next(it)
            assert d.redelivered
            await w.settle([(d, Settle.ACK, "")])
            await it.aclose()
            return [d.ref]

    assert asyncio.run(main()) == ["m-1.json"]
    assert files(q, "done") == ["m-1.json"]


def test_a_live_consumer_s_claim_is_left_alone(tmp_path: Path) -> None:
    q = make_queue(tmp_path, [])
    src = tmp_path / "x.json"
    src.write_text("{}")
    live = _dead_claim(q, "m-1.json", src)
    fd = os.open(live / LOCK, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with Worker(DirQueue(q)):
            pass
        assert (live / "m-1.json").exists()
    finally:
        os.close(fd)
