"""Connecting to a NATS server, and nats-py's errors as onceq's (one line, an exit code).

nats-py reconnects by itself (`max_reconnect_attempts=-1`): a consumer keeps its
subscription and its in-flight copies across a drop, and a copy whose ack was lost
is redelivered after AckWait, which the ledger absorbs. The first connect is bounded
and refused at once (exit 7), so a run against a server that is down leaves nothing
behind.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from onceq._core.redact import redact_url
from onceq.errors import BrokerUnavailable, NotFound, OnceqError

log = logging.getLogger("onceq.nats")

CONNECT_TIMEOUT = 5.0
# Seconds between reconnect attempts: every second without a connection is a second
# of messages not moving (nats-py's default is 2).
RECONNECT_WAIT = 1.0
# Seconds a JetStream API request (stream/consumer info, a publish's PubAck) may take.
API_TIMEOUT = 5.0


def where(url: str, what: str = "") -> str:
    return f"NATS server {redact_url(url)}" + (f" ({what})" if what else "")


async def connect(url: str, *, quiet: bool = False, **callbacks: Any) -> Any:
    """A connection to `url` that reconnects by itself; BrokerUnavailable (7) if none."""
    import nats  # start-up time: only when a NATS command or flow runs

    async def _error(exc: Exception) -> None:
        # nats-py reports every failed reconnect attempt here: said once per outage by
        # the transport's own callbacks, so only at DEBUG.
        log.debug("nats: %s", type(exc).__name__, extra={"event": "connection-lost"})

    try:
        nc = await nats.connect(
            url,
            connect_timeout=CONNECT_TIMEOUT,
            reconnect_time_wait=RECONNECT_WAIT,
            # The first connect is tried twice, not for ever (nats-py's -1 also applies to
            # it): a server that is down is exit 7 now. Once connected, reconnects are
            # for ever (set below; nats-py reads both options at each disconnect).
            max_reconnect_attempts=1,
            allow_reconnect=False,
            error_cb=_error,
            **callbacks,
        )
    except OnceqError:
        raise
    except Exception as exc:
        raise BrokerUnavailable(f"{where(url)}: cannot connect ({_reason(exc)})") from None
    nc.options["allow_reconnect"] = True
    nc.options["max_reconnect_attempts"] = -1
    return nc


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextlib.contextmanager
def boundary(url: str, what: str = "") -> Iterator[None]:
    """nats-py's errors inside as onceq's: not found (3), anything else unavailable (7)."""
    import nats.errors
    import nats.js.errors as jse

    try:
        yield
    except OnceqError:
        raise
    except jse.NotFoundError:
        raise NotFound(f"{where(url)}: no {what or 'such stream or consumer'}") from None
    except jse.NoStreamResponseError:
        raise NotFound(f"{where(url)}: no stream takes {what or 'that subject'}") from None
    except (nats.errors.Error, OSError, TimeoutError) as exc:
        raise BrokerUnavailable(f"{where(url, what)}: {_reason(exc)}") from None


async def close_quietly(nc: Any) -> None:
    """Close a connection whatever state it is in (a close must not hide the error)."""
    if nc is None:
        return
    with contextlib.suppress(Exception):
        await nc.close()
