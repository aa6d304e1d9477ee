"""A directory queue's metrics scan in a process of its own, beside the consumer.

    python -m onceq._sources.dirq.scanner QDIR     # one line in (any) -> one JSON line out

Why a process: counting and dating a large inbox/ is Python work per file (a stat, a
name check; 43 ms of CPU for 10,000 files here). In a thread it holds the consumer's
GIL, and a directory queue's loop, which gives the GIL up at every rename and fsync,
pays for it twice over: bench/metrics_cost.py measured the thread at 0.86-0.95 of the
rate without metrics, the same scan in a child at 1.0. The child is long-lived (its
`DirScan` keeps the mtimes of the files it has seen, so a standing backlog is one
listing per period) and scans only when asked.

Its lifetime is tied to the parent's: it reads requests on stdin and exits at EOF, so
a consumer that stops, or is killed with SIGKILL, takes its scanner with it. It
ignores SIGINT (a Ctrl-C on a terminal reaches the whole process group; the consumer
decides about stopping) and writes nothing to stderr (a JSON log stays JSON). If it
cannot be started or dies, the parent scans in a thread instead: the figures matter
more than the last few per cent.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from typing import Any

from onceq._sources.dirq.scan import DirScan


def _serve(root: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # An observer yields to what it observes: on a busy machine the consumer gets the
    # CPU first, and the figures come a little later.
    with contextlib.suppress(OSError):
        os.nice(10)
    scan = DirScan(root)
    for _ in sys.stdin:
        scan.scan()
        out: list[Any] = [scan.messages(), scan.oldest_mtime, scan.error]
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve(sys.argv[1])
