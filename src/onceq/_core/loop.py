"""The event loop a consume or publish run uses: uvloop where it is installed.

uvloop (a libuv loop, a dependency on the platforms it supports) runs onceq's
consumer in ~12 % fewer instructions per message than asyncio's own loop (callgrind,
`mq consume --prefetch 20`, fast partner: 1.10M against 1.24M per message;
BENCHMARKS.md). It changes no ordering the reliability depends on: commit before
ack is awaited in onceq's own code, not left to callback order. ONCEQ_LOOP=asyncio
chooses asyncio's loop (to rule the loop out when chasing a bug); so does a platform
without uvloop. Short commands (status, topology) keep asyncio's loop: they would
pay uvloop's import (~5 ms) and gain nothing.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

ENV = "ONCEQ_LOOP"


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory, or None (asyncio's default) when opted out or absent."""
    if os.environ.get(ENV, "").strip().lower() == "asyncio":
        return None
    try:
        import uvloop  # an optional speed-up: absent on Windows
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the loop `loop_factory` picks (same semantics: a new loop,
    pending tasks cancelled and async generators closed at the end)."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
