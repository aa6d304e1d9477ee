"""The console tests' helpers: a directory queue with dead letters, a console on it in a thread."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onceq import DirSource, Flow, MessageSpec, PythonEffect, Reject
from onceq import run as run_flows
from onceq._console.server import ConsoleThread, url_of
from onceq._console.state import ConsoleState
from onceq._sources.dirq.queue import DirQueue
from support import free_port


def refuse_odd(doc: dict[str, Any]) -> None:
    if int(doc["n"]) % 2:
        raise Reject("odd total")


@dataclass
class Served:
    url: str
    root: Path
    ledger: Path
    flow: Flow

    def csrf(self) -> str:
        with urllib.request.urlopen(f"{self.url}/api/session", timeout=10) as r:
            return str(json.load(r)["csrf"])


def dead_queue(base: Path, n: int = 8) -> tuple[Flow, Path, Path]:
    """A directory queue of n messages, the odd ones dead (reason rejected)."""
    root = base / "q"
    DirQueue(root).init()
    for i in range(n):
        (root / "inbox" / f"m{i}.json").write_text(json.dumps({"id": f"m{i}", "n": i}))
    flow = Flow("f", DirSource(root), MessageSpec(id_field="id"), effect=PythonEffect(refuse_odd))
    ledger = base / "ledger.db"
    run_apart(flow, ledger)
    return flow, root, ledger


def run_apart(flow: Flow, ledger: Path) -> Any:
    """`onceq.run(flow, until_empty=True)` in a thread of its own: Playwright's sync API
    keeps an event loop running in the test's thread, where no other loop may run."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run_flows, flow, ledger=ledger, until_empty=True).result()


def serve(flow: Flow, root: Path, ledger: Path, *, read_only: bool = False) -> Iterator[Served]:
    port = free_port()
    console = ConsoleThread(
        ConsoleState([flow], ledger, read_only=read_only), "127.0.0.1", port, None
    )
    console.start()
    try:
        yield Served(url_of("127.0.0.1", port).rstrip("/"), root, ledger, flow)
    finally:
        console.close()
