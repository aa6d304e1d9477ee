"""Live progress of a long consume run: one status line on a terminal's stderr.

    with live_progress("q", "quarantined") as on_settled:
        consume(..., on_settled=on_settled)

The line counts what has been settled (processed, duplicates, dead letters) and the
rate, fed by the consumer's `on_settled` hook, and is redrawn a few times a second by
a thread, so the rate stays true while nothing settles (a slow partner, an empty
queue). It is shown only when stderr is a terminal (and the logs are not JSON): piped
or redirected output gets nothing extra, and stdout (the summary, the JSON) is never
touched. It is erased when the run ends, before the summary is printed.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from onceq.ledger.sqlite import Entry

REFRESH = 0.25  # seconds between redraws
CLEAR = "\r\x1b[2K"  # to column 0, erase the line


class StatusLine:
    """Counts settled entries and draws them as one line on `stream`."""

    def __init__(self, label: str, dead_word: str, stream: TextIO) -> None:
        from onceq.core.consumer import Stats

        self.label = label
        self.stream = stream
        self.stats = Stats(dead_word=dead_word)
        self.started = time.monotonic()
        self._lock = threading.Lock()  # one writer at a time: the thread or stop()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="onceq-progress", daemon=True)

    def settled(self, group: Sequence[Entry]) -> None:
        """The consumer's on_settled: runs on the event loop, so it only counts."""
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
        self._done.set()
        self._thread.join()
        self.draw()
        with self._lock:
            self.stream.write(CLEAR)
            self.stream.flush()


@contextmanager
def live_progress(
    label: str, dead_word: str, stream: TextIO | None = None
) -> Iterator[Callable[[Sequence[Entry]], None] | None]:
    """Yield an on_settled hook that feeds a status line, or None when not on a terminal."""
    from onceq.core.logs import json_mode

    stream = stream or sys.stderr
    # With --log-format json every stderr line is an object a reader parses, even on
    # a terminal (a log viewer's pty): no status line is drawn between them.
    if not stream.isatty() or json_mode():
        yield None
        return
    line = StatusLine(label, dead_word, stream)
    line.start()
    try:
        yield line.settled
    finally:
        line.stop()
