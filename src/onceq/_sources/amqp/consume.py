"""Where a RabbitMQ consumer's ledger is unless told (`default_db`), and its defaults.

A RabbitMQ flow's run is the one run path (onceq._flows.runner) over the feed its
source type opens (onceq._sources.amqp.open: broker first, then the ledger, the grace
of a stop, `--until-empty`); `mq consume` and `mq dead` name their ledger by this
module's rule.
"""

from __future__ import annotations

import os
from pathlib import Path

from onceq._ledger.target import Target, as_target

ENV_DB = "EAI_MQ_DB"
DEFAULT_DB = "processed.db"


def default_db(fallback_dir: Path | None = None) -> Target:
    """EAI_MQ_DB, else processed.db in `fallback_dir` (the lab folder) or the cwd.

    EAI_MQ_DB may be a postgresql:// URL (a ledger shared by consumers on many hosts);
    a mistyped one is refused here, naming the variable, its password masked.
    """
    env = os.environ.get(ENV_DB)
    if env:
        return as_target(env, ENV_DB)
    return (fallback_dir or Path.cwd()) / DEFAULT_DB
