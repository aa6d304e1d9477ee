"""A flow file's key tables. Each key is read by onceq._core.keys (every mistake
collected); a source's own keys are its source type's (`SourceType.file_keys`).
"""

from __future__ import annotations

import re

from onceq._sources import registry

TOP_KEYS = {"ledger", "flows", "metrics"}
METRICS_KEYS = {"host", "port"}  # [metrics]: where /metrics and /healthz are served
# The keys every [flows.NAME] table may have whatever its source: the message spec's
# and its effects'. A source's own keys (`path`, `queue`, …) are its type's.
COMMON_FLOW_KEYS = frozenset(
    {
        "source",
        "id_field",
        "required",
        "group_field",
        "seq_field",
        "keep",
        "max_bytes",
        "http",
        "python",
        "sql",
        "retry",
        "breaker",
        "guard",
    }
)


def flow_keys() -> frozenset[str]:
    """Every key a [flows.NAME] table may have: the common ones and every source type's."""
    return COMMON_FLOW_KEYS.union(*(t.file_keys for t in registry.types()))


HTTP_KEYS = {
    "url",
    "method",
    "headers",
    "idempotency_header",
    "success",
    "duplicate",
    "reject",
    "transient",
    "timeout",
    "concurrency",
}
STATUS_KEYS = ("success", "duplicate", "reject", "transient")
ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
