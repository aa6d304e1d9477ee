"""A library user's own transport object as a flow's source (`MemoryTransport`, theirs).

Any object with `deliveries()` and `settle()` (onceq._core.transport.Transport) is a
source: the run drives it as it is. It has no flow-file section, no depths and no
health of its own, and `onceq status` does not name its kind.
"""

from __future__ import annotations

from onceq._sources.registry import SourceType

__all__ = ["TRANSPORT", "TransportType"]


class TransportType(SourceType):
    kind = "transport"
    public = False

    def accepts(self, source: object) -> bool:
        return hasattr(source, "deliveries") and hasattr(source, "settle")


TRANSPORT = TransportType()
