"""`nats publish` when PubAcks stop coming: the window stalls, the run ends, exit 6.

A subject some plain subscriber listens on and never answers is a stream that does
not acknowledge: the server has a responder, so no 503 comes, and no PubAck either.
The publisher fills its window, sees no answer for API_TIMEOUT, sends nothing more,
and reports every message as not acknowledged: nothing counts as stored that the
stream did not confirm, and the run does not hang.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import pytest

from nats_support import URL, server_answers
from onceq._sources.message_files import load_messages
from onceq._sources.nats.connect import API_TIMEOUT
from onceq._sources.nats.publisher import publish
from onceq.errors import Unroutable


def test_no_pubacks_is_every_message_not_acknowledged_and_no_hang(tmp_path: Path) -> None:
    if not server_answers(URL):
        pytest.fail(f"no NATS server at {URL}")
    subject = f"onceq.test.silent.{uuid.uuid4().hex[:8]}"
    paths = []
    for i in range(12):
        p = tmp_path / f"m{i:02d}.json"
        p.write_text(json.dumps({"guid": f"g-{i}"}))
        paths.append(p)
    messages = load_messages(paths)

    async def run() -> tuple[Unroutable, float, int]:
        import nats

        silent = await nats.connect(URL)
        heard: list[bytes] = []

        async def swallow(msg: object) -> None:  # listens, never answers
            heard.append(getattr(msg, "data", b""))

        await silent.subscribe(subject, cb=swallow)
        await silent.flush()
        t0 = time.monotonic()
        try:
            with pytest.raises(Unroutable) as caught:
                await publish(URL, messages, subject, window=4)
        finally:
            await silent.close()
        return caught.value, time.monotonic() - t0, len(heard)

    exc, took, heard = asyncio.run(run())
    report = exc.report  # type: ignore[attr-defined]
    assert report.published == 0 and report.duplicates == [] and report.unroutable == []
    # Every message failed, in file order: the 4 of the window that were sent and never
    # answered, and the 8 never sent once the window stalled.
    assert report.failed == [str(p) for p in paths]
    assert heard == 4, heard
    assert "12 of 12" in str(exc) and "not acknowledged" in str(exc)
    # Bounded: the stall is told after API_TIMEOUT (checked every API_TIMEOUT), then
    # the window's PubAcks get API_TIMEOUT more.
    assert took < 4 * API_TIMEOUT, took
