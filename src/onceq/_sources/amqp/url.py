"""The broker URL, its vhost, and the AMQP error boundary.

Every aiormq/aio-pika exception that reaches a user passes through `translate`
(or the `boundary` context manager around it): nowhere else is a third-party
AMQP exception turned into an onceq error, so the wording and the exit codes are
decided in one screen.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from onceq._core.redact import redact_text, redact_url
from onceq._core.url_check import check_url, shown
from onceq.errors import (
    BrokerUnavailable,
    Conflict,
    NotFound,
    OnceqError,
    Unroutable,
    UsageError,
)

if TYPE_CHECKING:
    from aiormq.abc import AbstractConnection

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
ENV_URL = "EAI_AMQP_URL"
# Seconds to wait for the TCP connect + AMQP handshake. Without a bound a broker that
# accepts the socket and then says nothing would hang a command forever.
CONNECT_TIMEOUT = 10.0


def amqp_url(url: str | None = None) -> str:
    """The URL to use: the argument, else EAI_AMQP_URL, else the local default."""
    url = url or os.environ.get(ENV_URL) or DEFAULT_URL
    return check_url(url, f"{ENV_URL}=", ("amqp", "amqps"), "a broker's port")


def vhost_of(url: str) -> str:
    """The vhost a URL names: its path without the leading '/', unquoted; '/' when empty."""
    path = urlsplit(url).path
    vhost = unquote(path[1:]) if path.startswith("/") else unquote(path)
    return vhost or "/"


def _reason(exc: BaseException) -> str:
    """The broker's reply text (e.g. 'PRECONDITION_FAILED - inequivalent arg …')."""
    args = getattr(exc, "args", ())
    text = next((a for a in args if isinstance(a, str) and a), None)
    if text is None and args:
        first = args[0]
        text = getattr(first, "reply_text", None) or str(first)
    return redact_text(" ".join((text or type(exc).__name__).split()))


def translate(exc: BaseException, url: str, what: str = "") -> OnceqError:
    """The onceq error for an AMQP-level failure. `what` names the object being handled."""
    import aiormq.exceptions as ae

    where = f"{what}: " if what else ""
    if isinstance(exc, OnceqError):
        return exc
    if isinstance(exc, ae.ChannelPreconditionFailed):
        return Conflict(f"{where}the broker holds it with other attributes (406): {_reason(exc)}")
    if isinstance(exc, ae.ChannelNotFoundEntity):
        return NotFound(f"{where}not found in vhost {vhost_of(url)!r} (404): {_reason(exc)}")
    if isinstance(exc, ae.PublishError):
        return Unroutable(f"{where}returned by the broker as unroutable: {_reason(exc)}")
    if isinstance(exc, ae.DeliveryError):
        return Unroutable(f"{where}the broker refused it (nack)")
    if isinstance(exc, ae.ChannelAccessRefused):
        return BrokerUnavailable(f"{where}access refused in vhost {vhost_of(url)!r}")
    if isinstance(exc, ae.ProbableAuthenticationError | ae.AuthenticationError):
        return BrokerUnavailable(f"{redact_url(url)}: login refused ({_reason(exc)})")
    if isinstance(exc, TimeoutError):
        return BrokerUnavailable(f"{redact_url(url)}: no answer within {CONNECT_TIMEOUT:g}s")
    if isinstance(exc, ae.InvalidFrameError) and "Connection.OpenOk" in str(exc):
        # The broker answers Connection.Open on a vhost that does not exist (or that the
        # user has no permission for) with Connection.Close; aiormq keeps only the text.
        return BrokerUnavailable(
            f"{redact_url(url)}: vhost {vhost_of(url)!r} does not exist or the user may"
            " not use it (the broker closed the connection when it was opened)"
        )
    if isinstance(exc, ae.AMQPError | OSError | ae.ChannelInvalidStateError):
        # A missing vhost arrives as an unexpected Connection.Close during the handshake.
        return BrokerUnavailable(
            f"{redact_url(url)}: cannot use the broker (vhost {vhost_of(url)!r}): {_reason(exc)}"
        )
    return BrokerUnavailable(f"{redact_url(url)}: {_reason(exc)}")


@contextmanager
def boundary(url: str, what: str = "") -> Iterator[None]:
    """Translate AMQP failures raised inside the block (see `translate`)."""
    import aiormq.exceptions as ae

    failures = (ae.AMQPError, ae.ChannelInvalidStateError, OSError, TimeoutError)
    try:
        yield
    except failures as exc:
        raise translate(exc, url, what) from None


async def connect(url: str) -> AbstractConnection:
    """A plain aiormq connection (topology, publisher: one-shot commands, no reconnect)."""
    import aiormq

    with boundary(url):
        try:
            return await asyncio.wait_for(aiormq.connect(url), CONNECT_TIMEOUT)
        except ValueError:
            # A URL the checks let through but the parser refuses: a user's mistake,
            # one masked line (exit 2), never a traceback with the URL in it.
            raise UsageError(f"{shown(url)}: not a valid broker URL") from None


async def close_quietly(connection: Any) -> None:
    """Close a connection that may already be broken; the first error is the one to report.

    `connection`: an aiormq or aio-pika connection, or None (not opened yet): any error
    closing it, an AttributeError included, is suppressed.
    """
    import contextlib

    with contextlib.suppress(Exception):
        await connection.close()
