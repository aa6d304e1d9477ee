"""A partner stub's outage: its front door down for a while, then back by itself.

    POST /_outage?mode=refuse|503|hang&seconds=S[&retry_after=N]
    onceq partner claim --down-for S --down-as refuse|503|hang [--retry-after N]

The three ways a real partner is down, as a consumer meets them:

- refuse: nothing listens. The listening socket is closed for the window (and the
  kept-alive connections with it), so a connect is refused (ECONNREFUSED); then it
  listens again on the same port.
- 503: every call is answered 503 at once (with `Retry-After: N` when given), as a
  load balancer does in front of a partner that is down.
- hang: every call waits, unanswered, until the window ends (so the client's timeout
  fires first), then is answered 504.

Why a call in the window never reaches the rule set (nor by_id, by_key, the
tallies): the outage is the front door's, the partner's application never saw the
call. So "every claim called exactly once" after an outage is still by_id == 1,
and what the outage turned away is counted apart: `total`, `by_status` (503/504)
and `calls_during_outage`. Why the window ends by itself and not by a request: a
refused listener cannot be reached to be told to come back, and a test (or the
benchmark) states the outage it means up front ("the first 12 s"), not by a race
with the consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable
from typing import TextIO

MODES = ("refuse", "503", "hang")
# The longest outage a stub takes: a day is past any test or demo, and a typo of a
# few more digits should be refused, not hang a stub for years.
MAX_SECONDS = 86_400.0


def check(mode: str, seconds: float, retry_after: int | None) -> str:
    """Why an outage cannot be had ('' when it can); the wording names the option."""
    if mode not in MODES:
        return f"mode {mode!r}: not refuse, 503 or hang"
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_SECONDS):
        return f"seconds {seconds!r}: must be more than 0 and at most {MAX_SECONDS:g}"
    if retry_after is not None:
        if mode != "503":
            return "retry_after: only with mode 503 (it is a header of the 503 answer)"
        if not 0 <= retry_after <= MAX_SECONDS:
            return f"retry_after {retry_after}: must be 0-{MAX_SECONDS:g}"
    return ""


class Outage:
    """The stub's current outage (none, or one mode until a deadline) and its counter.

    The listener hooks (`close_listener`, `open_listener`) are set by `serve`, which
    owns the listening site; a bare `make_app` (no site of its own) cannot refuse.
    """

    def __init__(self, title: str, out: TextIO | None = None) -> None:
        self.title = title
        self.out = out
        self.mode: str | None = None
        self.retry_after: int | None = None
        self.calls = 0  # calls that arrived during an outage (never reached the rules)
        self._until = 0.0
        self._back: asyncio.Event | None = None
        self._timer: asyncio.Task[None] | None = None
        self.close_listener: Callable[[], Awaitable[None]] | None = None
        self.open_listener: Callable[[], Awaitable[None]] | None = None

    @property
    def remaining(self) -> float:
        if self.mode is None:
            return 0.0
        return max(0.0, self._until - asyncio.get_running_loop().time())

    def as_dict(self) -> dict[str, object] | None:
        if self.mode is None:
            return None
        return {"mode": self.mode, "remaining_s": round(self.remaining, 3)}

    async def start(
        self, mode: str, seconds: float, retry_after: int | None = None, *, announce: bool = True
    ) -> str:
        """Begin an outage now; why not ('' once begun). It ends by itself after `seconds`.

        announce=False: the caller prints the "down" line (`serve`, after its listening
        line, for an outage that starts with the stub).
        """
        why = check(mode, seconds, retry_after)
        if why:
            return why
        if self.mode is not None:
            # One at a time: a refused stub could not be told of a second one anyway,
            # and an overlap would make "back at T" ambiguous.
            return f"an outage ({self.mode}) is on for {self.remaining:.1f}s more"
        if mode == "refuse" and self.close_listener is None:
            return "refuse: this stub does not own its listener"
        loop = asyncio.get_running_loop()
        self.mode, self.retry_after = mode, retry_after
        self._until = loop.time() + seconds
        self._back = asyncio.Event()
        if mode == "refuse":
            assert self.close_listener is not None
            await self.close_listener()
        if announce:
            self._say(self.down_line(mode, seconds))
        self._timer = asyncio.create_task(self._end_after(seconds), name="onceq-outage")
        return ""

    async def _end_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self.end()

    async def end(self, *, quiet: bool = False) -> None:
        """Back up: listen again (refuse), answer the hung calls (hang)."""
        if self.mode is None:
            return
        mode = self.mode
        self.mode = None
        if self._timer is not None and self._timer is not asyncio.current_task():
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
        self._timer = None
        if mode == "refuse" and self.open_listener is not None and not quiet:
            await self.open_listener()
        if self._back is not None:
            self._back.set()  # the hung calls go on (to their 504)
        if not quiet:
            self._say(f"{self.title} stub back up")

    async def turn_away(self) -> tuple[int, dict[str, str]] | None:
        """A call's answer while the stub is down (status, headers); None when it is up.

        Counted here, before any wait: a hung call is a call the stub saw.
        """
        if self.mode is None:
            return None
        self.calls += 1
        if self.mode == "hang":
            assert self._back is not None
            await self._back.wait()
            return 504, {}
        if self.mode == "503":
            headers = {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}
            return 503, headers
        # refuse, yet a call arrived: on a connection opened before the outage and not
        # yet closed. Answered like the front door's 503, and the connection is closed.
        return 503, {"Connection": "close"}

    def down_line(self, mode: str, seconds: float) -> str:
        return f"{self.title} stub down ({mode}) for {seconds:g}s"

    def _say(self, line: str) -> None:
        if self.out is not None:
            self.out.write(line + "\n")
            self.out.flush()
