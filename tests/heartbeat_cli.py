"""`python tests/heartbeat_cli.py ARGS` = `onceq ARGS` with a short heartbeat period.

Telemetry.track (onceq._ops.telemetry) starts a Heartbeat for every consumer it watches,
with the production period (5 s). A test that wants to see a stale row within seconds
instead of 15 runs the real CLI through this wrapper, which only shortens the period:
everything else — the consume paths, their heartbeats, the signals, the stop, the
ledger — is the real CLI in a real process.

ONCEQ_TEST_HEARTBEAT_EVERY: the period (default 1 s).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import onceq._ops.heartbeat

EVERY = float(os.environ.get("ONCEQ_TEST_HEARTBEAT_EVERY", "1"))


class ShortHeartbeat(onceq._ops.heartbeat.Heartbeat):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["every"] = EVERY
        super().__init__(*args, **kwargs)


# Telemetry.track imports the name at each start: this one is found.
onceq._ops.heartbeat.Heartbeat = ShortHeartbeat  # type: ignore[misc]

if __name__ == "__main__":
    from onceq._cli import main

    main(sys.argv[1:])
