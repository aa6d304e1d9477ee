"""The event loop a consume or publish run uses: asyncio's, or uvloop's when asked for.

uvloop runs onceq's consumer in ~12 % fewer instructions per message than asyncio's
own loop (callgrind, `mq consume --prefetch 20`, fast partner: 1.10M against 1.24M per
message; publish 616k against 702k per file; a directory queue the same either way).
It is opt-in, not the default: with it as the default, two runs were found idle in
their loop for good in the test suite (a `dirq consume --workers 2` child, and an
in-process `onceq run --until-empty`), which asyncio's loop has never done here; until
that is understood a speed-up does not outweigh a consumer that stops. ONCEQ_LOOP=uvloop
chooses it (`pip install onceq[uvloop]`); anything else, or uvloop missing, asyncio's.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

ENV = "ONCEQ_LOOP"


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory when ONCEQ_LOOP=uvloop and it is installed, else None
    (asyncio's default)."""
    if os.environ.get(ENV, "").strip().lower() != "uvloop":
        return None
    try:
        import uvloop  # an optional extra: onceq[uvloop]
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the loop `loop_factory` picks (same semantics: a new loop,
    pending tasks cancelled and async generators closed at the end)."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
