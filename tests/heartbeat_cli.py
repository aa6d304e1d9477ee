"""`python tests/heartbeat_cli.py ARGS` = `onceq ARGS` with a Heartbeat around every consumer.

A stand-in for the wiring that belongs to Telemetry.track (h2's `onceq.telemetry`):
every consume path builds its `Consumer` from its own module's name, so this wrapper
replaces that name with a subclass whose run() starts a Heartbeat on the consumer's
ledger and closes it (the final "stopped" row) when the run ends. Everything else is
the real CLI in a real process: its signals, its stop, its ledger. Once the telemetry
hub starts heartbeats itself, the tests can run `python -m onceq` instead.

ONCEQ_TEST_HEARTBEAT_EVERY: the period (default 1 s, so that a test sees a stale row
within seconds instead of 15).

Once `onceq.telemetry` starts a Heartbeat itself, nothing is replaced (two heartbeats
would publish two rows per consumer): the wrapper is then plain `onceq`.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from onceq.consumer import Consumer
from onceq.heartbeat import Heartbeat, consumer_state

EVERY = float(os.environ.get("ONCEQ_TEST_HEARTBEAT_EVERY", "1"))


class BeatingConsumer(Consumer):
    async def run(self) -> Any:
        ledger: Any = self.ledger
        target = getattr(ledger, "url", None) or ledger.path
        hb = Heartbeat(target, ledger.flow, consumer_state(self), every=EVERY)
        await hb.start()
        try:
            return await super().run()
        finally:
            await hb.aclose()


def _wired() -> bool:
    import inspect

    import onceq.telemetry

    return "Heartbeat(" in inspect.getsource(onceq.telemetry)


# onceq.consumer too: the runner imports the name inside its function.
for name in (
    () if _wired() else ("onceq.consumer", "onceq.amqp.consume", "onceq.dirq.run", "onceq.runner")
):
    module = importlib.import_module(name)
    if hasattr(module, "Consumer"):
        module.Consumer = BeatingConsumer  # type: ignore[attr-defined]

if __name__ == "__main__":
    from onceq.cli import main

    main(sys.argv[1:])
