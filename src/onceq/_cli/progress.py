"""Live progress of a long consume run: one status line on a terminal's stderr.

    hooks = RunHooks()
    with live_progress("q", "quarantined", hooks):
        run_report(flows, ledger, hooks=hooks)

The line counts what has been settled (processed, duplicates, dead letters) and the
rate, fed by the consumers' settled groups (onceq._core.hooks: the run tells it each
consumer that starts, it subscribes), and is redrawn a few times a second by a
thread, so the rate stays true while nothing settles (a slow partner, an empty
queue). It is shown only when stderr is a terminal (and the logs are not JSON): piped
or redirected output gets nothing extra, and stdout (the summary, the JSON) is never
touched. It is drawn from the moment a consumer starts (a refused queue or ledger draws
nothing) and erased when the run ends, before the summary is printed.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

from onceq._core.logs import json_mode
from onceq._core.stats import Stats

if TYPE_CHECKING:
    from onceq._core.hooks import Hooks, RunHooks
    from onceq._ledger.sqlite import Entry

REFRESH = 0.25  # seconds between redraws
CLEAR = "\r\x1b[2K"  # to column 0, erase the line


class StatusLine:
    """Counts settled entries and draws them as one line on `stream`."""

    def __init__(self, label: str, dead_word: str, stream: TextIO) -> None:

        self.label = label
        self.stream = stream
        self.stats = Stats(dead_word=dead_word)
        self.started = time.monotonic()
        self._lock = threading.Lock()  # one writer at a time: the thread or stop()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="onceq-progress", daemon=True)

    def consumer(self, _flow: str, hooks: Hooks) -> None:
        """A consumer of the run starts: count its groups; the line shows from now on."""
        hooks.settled.append(self.settled)
        if not self._thread.is_alive():
            self.start()

    def settled(self, group: Sequence[Entry]) -> None:
        """A settled group: runs on the event loop, so it only counts."""
        for e in group:
            self.stats.received += 1
            self.stats.add(e)

    def text(self) -> str:
        s = self.stats
        elapsed = max(time.monotonic() - self.started, 1e-9)
        # The count and the rate first, the label (a queue's path may be long) last:
        # the line is cut at the terminal's width, and what is cut must be the least
        # needed part, not the rate on an 80-column terminal.
        return (
            f"{s.received} settled · {s.received / elapsed:.0f} msg/s · {elapsed:.0f}s ·"
            f" {s.processed} processed, {s.duplicates} duplicates, {s.requeued} requeued,"
            f" {s.dead} {s.dead_word} · {self.label}"
        )

    def draw(self) -> None:
        # Cut to the terminal's width: a line that wraps cannot be erased by \r.
        width = shutil.get_terminal_size().columns - 1
        with self._lock:
            self.stream.write(CLEAR + self.text()[:width])
            self.stream.flush()

    def _loop(self) -> None:
        while not self._done.wait(REFRESH):
            self.draw()

    def start(self) -> None:
        self.draw()
        self._thread.start()

    def stop(self) -> None:
        """Draw the final counts once, then erase the line for the summary."""
        if not self._thread.is_alive():
            return  # never shown: no consumer started
        self._done.set()
        self._thread.join()
        self.draw()
        with self._lock:
            self.stream.write(CLEAR)
            self.stream.flush()


@contextmanager
def live_progress(
    label: str, dead_word: str, hooks: RunHooks, stream: TextIO | None = None
) -> Iterator[None]:
    """While inside, a status line fed by the run's consumers (`hooks`), on a terminal."""
    stream = stream or sys.stderr
    # With --log-format json every stderr line is an object a reader parses, even on
    # a terminal (a log viewer's pty): no status line is drawn between them.
    if not stream.isatty() or json_mode():
        yield
        return
    line = StatusLine(label, dead_word, stream)
    hooks.consumer.append(line.consumer)
    try:
        yield
    finally:
        line.stop()
