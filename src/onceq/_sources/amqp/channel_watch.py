"""A consume channel the broker closed on a live connection: say why, reopen it.

The broker closes a channel (not the connection) for a channel error: ACCESS_REFUSED
(403) when the user's permissions were revoked, NOT_FOUND (404) for a deleted queue,
PRECONDITION_FAILED (406) for an unknown delivery tag. aio-pika's robust channel
reopens it at once, but if that reopen fails too (the permissions are still revoked,
the queue still gone) it gives up — and the consumer would then idle silently for
ever, its connection up, no consumer on the broker. So:

- the close is one warning with the broker's reason (event `channel-closed`, `cause`
  from onceq._sources.amqp.copy_cause's table);
- while the connection is up and the channel stays closed, it is reopened every
  `interval` seconds (aio-pika restores qos, the queue and the consumer with it);
  the recovery is one warning (`channel-reopened`). A lost connection is the robust
  connection's to restore (onceq._sources.amqp.transport says that loss itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from onceq._sources.amqp.copy_cause import cause_of

log = logging.getLogger("onceq.amqp.transport")


class ChannelWatch:
    """Watches one robust channel; `close()` at the transport's end."""

    def __init__(
        self, channel: Any, stopped: asyncio.Event, connected: Callable[[], bool], interval: float
    ) -> None:
        self.channel = channel
        self.stopped = stopped
        self.connected = connected
        self.interval = interval
        self._task: asyncio.Task[None] | None = None
        channel.close_callbacks.add(self._on_close)

    def _on_close(self, _channel: Any, exc: BaseException | None = None) -> None:
        import aiormq.exceptions as ae

        # Our own close, a stop, or the connection's loss (the robust connection's):
        # only a channel error the broker sent on a live connection is ours.
        if self.stopped.is_set() or not isinstance(exc, ae.ChannelClosed):
            return
        if self._task is not None and not self._task.done():
            return  # already reopening: one line per outage of the channel
        failure = cause_of(exc)
        log.warning(
            "the broker closed the consume channel (%s); reopening it every %gs",
            failure.detail or failure.cause,
            self.interval,
            extra={"event": "channel-closed", "cause": failure.cause},
        )
        self._task = asyncio.get_running_loop().create_task(self._reopen())

    async def _reopen(self) -> None:
        while not self.stopped.is_set():
            await asyncio.sleep(self.interval)
            if self.stopped.is_set() or not self.connected():
                continue  # a lost connection restores its channels when it is back
            if not self.channel.is_closed:
                break  # aio-pika's own reopen held
            try:
                await self.channel.reopen()
            except Exception:  # still refused: tried again, said once (above)
                continue
            break
        else:
            return
        log.warning("the consume channel is open again", extra={"event": "channel-reopened"})

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
