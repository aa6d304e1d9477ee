"""A library user's own transport object as a source type (onceq.sources.registry).

Placeholder until the source-type registry's own version lands: the base
SourceType's run path (`open`: the transport as it is) is all it needs.
"""

from __future__ import annotations

from onceq.sources.registry import SourceType


class TransportType(SourceType):
    kind = "transport"

    def accepts(self, source: object) -> bool:
        return hasattr(source, "deliveries") and hasattr(source, "settle")


TRANSPORT = TransportType()
