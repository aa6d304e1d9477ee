"""The directory queue as a source type (onceq.sources.registry).

Placeholder until the source-type registry's own version lands: only what the run
path asks (`open`, `copies`, `processes`, `fan_out`, `problem`) is here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from onceq.sources.dirq import run
from onceq.sources.dirq.open import DirFeed
from onceq.sources.registry import SourceType


class DirqType(SourceType):
    kind = "dirq"

    def accepts(self, source: object) -> bool:
        return type(source).__name__ == "DirSource"  # placeholder: the registry's config

    def copies(self, source: Any) -> int:
        return int(source.workers)

    def problem(self, flow: Any, transport: Any) -> str | None:
        root = Path(flow.source.path)
        return None if (root / "inbox").is_dir() else f"queue folder {root} is gone"

    def open(self, flow: Any, until_empty: bool) -> DirFeed:
        return DirFeed(flow, until_empty)

    def processes(self, source: Any) -> int:
        return int(source.workers)

    def fan_out(self, n: int, child: Any, watch: Any, ctx: Any) -> Any:
        return run.fan_out(n, child, watch, ctx)


DIRQ = DirqType()
