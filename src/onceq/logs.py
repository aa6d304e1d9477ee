"""Logging set up for a command: human lines (the default) or one JSON object a line.

Every line passes through URL-password masking (`onceq.redact`), whatever its format.
"""

from __future__ import annotations

import logging

__all__ = ["setup"]

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def setup(fmt: str = "human", level: str = "warning") -> None:
    """One stderr handler in `fmt` ("human" | "json") at `level`."""
    from onceq.amqp.url import setup_logging

    setup_logging(LEVELS[level])
