"""One stop for everything a process runs: signals, a deadline, a failed flow.

Kept apart from the runner (onceq._flows.runner, which re-exports it) because a source's
feed waits on it (RabbitMQ's grace: `abort`) and sources sit below flows. The one run
path installs one per run, shared by all its flows: the caller picks its kind
(`mq consume`: a service, `second="abort"`), a --workers child installs one under its
parent's mask.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

from onceq._core import early
from onceq._core.waits import wait

__all__ = ["STOP_SIGNALS", "Stop"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stop:
    """One stop for everything a process runs: signals, a deadline, a failed flow.

    `add(on_stop)` registers a consumer's stop; `request()` calls them all (a deadline,
    a failure). The first signal does the same; a second one either re-raises the
    signal with its default action (`second="raise"`: the process ends at once, as
    safe as a kill -9) or sets `abort` (`second="abort"`: `mq consume` cuts its grace
    short and exits 130/143 itself). A signal counts as a second one when a stop was
    already requested, or when a registered `stopped()` says its consumer already
    stopped on its own (a drained queue).
    """

    def __init__(self, *, second: str = "raise", respect_ignored: bool = True) -> None:
        self.second = second
        # A --workers child ignores SIGINT (the parent forwards a stop): keep that. A
        # long-running `mq consume` takes both signals whatever it inherited.
        self.respect_ignored = respect_ignored
        self.signals: list[int] = []
        self.requested = False
        self.abort = asyncio.Event()
        self._wake = asyncio.Event()
        self._on_stop: list[Callable[[], None]] = []
        self._stopped: list[Callable[[], bool]] = []
        self._echo: set[int] = set()  # early's signals whose copy may still be in the pipe

    def add(self, on_stop: Callable[[], None], stopped: Callable[[], bool] | None = None) -> None:
        """Call `on_stop` at the stop (at once if it already came)."""
        self._on_stop.append(on_stop)
        if stopped is not None:
            self._stopped.append(stopped)
        if self.requested:
            on_stop()

    def discard(self, on_stop: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self._on_stop.remove(on_stop)

    def request(self) -> None:
        """Stop every registered consumer cleanly (idempotent)."""
        self.requested = True
        self._wake.set()
        for fn in list(self._on_stop):
            fn()

    async def sleep(self, seconds: float) -> bool:
        """Wait `seconds`, or less if a stop comes; True when stopped. A cancel that
        meets the stop's wake still cancels (`onceq._core.waits`)."""
        if not self.requested:
            await wait(self._wake, seconds)
        return self.requested

    def on_signal(self, signum: int) -> None:
        if signum in self._echo:
            self._echo.discard(signum)
            return
        if self.second == "abort":  # mq consume: any stop already under way makes it second
            second = self.requested or any(check() for check in self._stopped)
        else:  # a deadline's stop is not a signal: only a signal before this one counts
            second = bool(self.signals)
        self.signals.append(signum)
        if second and self.second != "abort":
            # As the default handler would: end now (the next run recovers the claims).
            self._uninstall()
            signal.raise_signal(signum)
            return
        if second:
            self.abort.set()
        self.request()

    @contextlib.contextmanager
    def installed(self) -> Iterator[Stop]:
        """Handle SIGINT/SIGTERM on the running loop (main thread only) while inside."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._installed: list[int] = []
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                if self.respect_ignored and signal.getsignal(s) is signal.SIG_IGN:
                    continue
                loop.add_signal_handler(s, self.on_signal, s)
                self._installed.append(s)
        # A --workers child starts with them blocked, so that none is lost or fatal
        # before this point; from here on they stop the run cleanly.
        mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, self._installed)
        # A signal that came before this loop (while the command loaded its flows,
        # bound its port, started asyncio: onceq._core.early kept it) stops the run now, as
        # if it had come on the first turn of the loop.
        taken = early.take()
        for early_signal in taken:
            self.on_signal(early_signal)
        if taken:
            # One signal can be counted twice here: one that came between the loop
            # setting its wakeup fd (the first add_signal_handler) and replacing
            # early's handler was both kept by early and written to the loop's pipe,
            # and the pipe's copy, read on the loop's next turn, would be taken for a
            # second signal (the process ended by SIGTERM's default action instead of
            # stopping cleanly). The pipe is read on the loop's next turn and its
            # handler runs on the turn after; until the third turn a copy is dropped,
            # and a later signal counts as usual.
            self._echo = set(taken)
            loop.call_soon(loop.call_soon, loop.call_soon, self._echo.clear)
        try:
            yield self
        finally:
            self._uninstall()
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def _uninstall(self) -> None:
        for s in getattr(self, "_installed", []):
            self._loop.remove_signal_handler(s)
        if getattr(self, "_installed", []) and early.active():
            # The command still prints its summary: a first signal then is kept (the
            # run's exit code is already decided); after a stop, a second one ends
            # the process at once, as it would have inside the loop.
            if self.signals:
                early.release()
            else:
                early.catch()
        self._installed = []
