"""One exception tree for everything onceq reports.

    OnceqError                      exit code
    ├── UsageError                  2   a user's argument is wrong (bad path, bad number)
    ├── NotFound                    3   a named file, queue or object does not exist
    ├── Conflict                    4   the target exists already, or the broker holds it
    │                                   with other attributes (406 PRECONDITION_FAILED)
    ├── BadMessage                  5   a message file cannot be published (unreadable,
    │                                   not JSON, no id)
    ├── Unroutable                  6   the broker returned or nacked a published message
    ├── BrokerUnavailable           7   the broker cannot be reached or refused the login
    ├── LedgerError                 8   the ledger database cannot be opened or written,
    │   │                               or its folder does not exist (never created)
    │   └── LedgerUnavailable       8   a PostgreSQL ledger's connection is lost (the
    │                                   loop holds its messages and reconnects; a
    │                                   command that cannot wait ends with 8)
    ├── QueueError                  9   a queue folder cannot be created, written or
    │                                   claimed in (permissions, disk full)
    ├── Misconfigured              10   the misconfiguration guard stopped a run: its
    │                                   first messages all failed the same way
    │                                   (onceq._core.misconfig); the rest are untouched
    └── AllFailed                  11   a batch finished and every message it received
                                        failed (none processed, none a duplicate)

Third-party exceptions (aiormq/aio-pika, aiohttp, sqlite3, OSError) are translated into
this tree at one boundary per library; the CLI maps the tree to exit codes and prints
the message as one line. A message never contains a URL password: use
`redact_url` before putting a URL in any text (onceq._core.redact: the masking rule, and
the CLI's last line of defence).
"""

from __future__ import annotations

from typing import Any, Protocol

# Masking lives in onceq._core.redact; re-exported here, where every message is made.
from onceq._core.redact import redact_text, redact_url

__all__ = [
    "EXIT_CODES",
    "AllFailed",
    "BadMessage",
    "BrokerUnavailable",
    "Conflict",
    "LedgerError",
    "LedgerUnavailable",
    "Misconfigured",
    "NotFound",
    "OnceqError",
    "QueueError",
    "Unroutable",
    "UsageError",
    "redact_text",
    "redact_url",
]


class OnceqError(Exception):
    """Base of every error onceq raises on purpose; `exit_code` is what the CLI returns."""

    exit_code = 1


class UsageError(OnceqError):
    exit_code = 2


class NotFound(OnceqError):
    exit_code = 3


class Conflict(OnceqError):
    exit_code = 4


class BadMessage(OnceqError):
    exit_code = 5


class Report(Protocol):
    """What a refusing command attaches for its --json output (`PublishReport`)."""

    def as_dict(self) -> dict[str, Any]: ...


class Unroutable(OnceqError):
    exit_code = 6
    # Set by `mq publish` (onceq._sources.amqp.publisher) when it refuses: its --json counts.
    # Typed by what the CLI reads of it, so the tree imports nothing above it.
    report: Report


class BrokerUnavailable(OnceqError):
    exit_code = 7


class LedgerError(OnceqError):
    exit_code = 8


class LedgerUnavailable(LedgerError):
    """The ledger's server cannot be reached now (a lost PostgreSQL connection).

    Not the message's fault and not a broken ledger: the consume loop holds the
    message untried (nothing recorded, nothing settled) and the ledger reconnects.
    """

    exit_code = 8


class QueueError(OnceqError):
    exit_code = 9


class Misconfigured(OnceqError):
    """The guard stopped a run (onceq._core.misconfig); `stats`: what it settled first."""

    exit_code = 10

    def __init__(self, message: str, stats: Any = None) -> None:
        super().__init__(message)
        self.stats = stats


class AllFailed(OnceqError):
    """A batch ended and every message it received failed; `stats`: its counts."""

    exit_code = 11

    def __init__(self, message: str, stats: Any = None) -> None:
        super().__init__(message)
        self.stats = stats


EXIT_CODES: dict[str, int] = {
    cls.__name__: cls.exit_code
    for cls in (
        UsageError,
        NotFound,
        Conflict,
        BadMessage,
        Unroutable,
        BrokerUnavailable,
        LedgerError,
        QueueError,
        Misconfigured,
        AllFailed,
    )
}
