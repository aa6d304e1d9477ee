"""The consume loop's Transport over a NATS JetStream durable pull consumer.

Reliability choices, each for a reason:
- A pull consumer with explicit acks: nothing leaves the stream before onceq acks it,
  and the loop acks only after the ledger commit (onceq._core.consumer).
- One consumer asks for at most `prefetch` copies at a time (a pull's batch is the
  room left): the durable's MaxAckPending is shared by every process on it, so each
  process bounds its own share, as RabbitMQ's basic_qos does per channel.
- In-progress acks (+WPI) for every copy held longer than half the consumer's
  AckWait: a slow partner call, or a copy waiting behind its twin's lease, must not be
  redelivered to another consumer while this one still works on it.
- nats-py reconnects by itself and keeps the subscription. An ack sent while the
  connection is down is buffered and sent after the reconnect, or lost: then the
  server redelivers the copy after AckWait and the ledger acks it without a call.
- A stop takes no more copies (no new pull); a pull already asked for may still bring
  some: those were never handed out and are given back at once (a plain NAK), so
  another consumer gets them now rather than after AckWait.
- `--until-empty`: the run ends once this consumer holds nothing and the durable
  consumer reports nothing pending, nothing ack-pending (a copy NAKed with a delay is
  still ack-pending: its retry is part of the batch) and nothing waiting redelivery.

How a copy is settled (ack, NAK, NAK with a delay, a confirmed dead letter then the
ack) is `onceq._sources.nats.settle`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from onceq._core.redact import redact_url
from onceq._core.transport import Delivery
from onceq._sources.nats.connect import API_TIMEOUT, boundary, close_quietly, connect
from onceq._sources.nats.names import DEFAULT_ACK_WAIT, dead_subject_of
from onceq._sources.nats.pull import Puller
from onceq._sources.nats.settle import NatsSettling
from onceq.errors import NotFound, UsageError

log = logging.getLogger("onceq.nats.transport")

# Seconds one pull waits on the server for a copy: how often an idle consumer asks,
# and the longest a stop waits for the pull under way.
PULL_WAIT = 1.0
_END = object()
# The header a publisher's id travels in (server-side de-duplication inside the
# stream's window, onceq's ledger beyond it).
MSG_ID = "Nats-Msg-Id"


class NatsTransport(NatsSettling):
    """Deliveries from one durable pull consumer of one stream."""

    def __init__(
        self,
        url: str,
        *,
        stream: str,
        durable: str,
        prefetch: int = 5,
        until_empty: bool = False,
        dead_subject: str | None = None,
    ) -> None:
        self.url = url
        self.stream = stream
        self.durable = durable
        self.prefetch = prefetch
        self.until_empty = until_empty
        self.dead_subject = dead_subject or dead_subject_of(stream)
        self.ack_wait = DEFAULT_ACK_WAIT  # the consumer's own, read at open
        self.drained = False
        self.unsettled = 0  # settles lost with the connection (the server redelivers)
        self.delayed = 0
        self.stopped = asyncio.Event()
        self.paused = False
        self._probes = 0
        self._buffer: collections.deque[Any] = collections.deque()
        self._held: dict[int, list[Any]] = {}  # id(delivery) -> [delivery, last touched]
        self._changed = asyncio.Event()
        self._nc: Any = None
        self._js: Any = None
        self._pull: Puller | None = None
        self._down = False
        self._keeper: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()  # give-backs under way, awaited at close

    # -- opening ---------------------------------------------------------------------
    async def open(self) -> None:
        """Connect and check the consumer and the dead-letter stream; nothing is taken.

        Split from `start` so the ledger is opened in between: a run the server refuses
        (down, no stream, no consumer) leaves no ledger file behind.
        """
        import nats.js.errors as jse

        self._nc = await connect(
            self.url,
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
        )
        try:
            self._js = self._nc.jetstream(timeout=API_TIMEOUT)
            with boundary(self.url, f"consumer {self.durable} on stream {self.stream}"):
                try:
                    info = await self._js.consumer_info(self.stream, self.durable)
                except jse.NotFoundError:
                    raise NotFound(
                        f"NATS server {redact_url(self.url)}: no consumer {self.durable} on"
                        f" stream {self.stream}; create it first: {self.setup_command()}"
                    ) from None
            config = info.config
            if config.deliver_subject:
                raise UsageError(
                    f"consumer {self.durable} is a push consumer; onceq pulls (create a pull"
                    f" consumer: {self.setup_command()})"
                )
            if getattr(config.ack_policy, "value", config.ack_policy) != "explicit":
                raise UsageError(
                    f"consumer {self.durable} does not use explicit acks: a copy would be"
                    " gone before its record is durable"
                )
            self.ack_wait = float(config.ack_wait or DEFAULT_ACK_WAIT)
            # Before anything is consumed: a dead letter with nowhere to go would leave
            # every rejected message circulating (NotFound, one line).
            with boundary(self.url, f"dead-letter subject {self.dead_subject}"):
                try:
                    await self._js.find_stream_name_by_subject(self.dead_subject)
                except jse.NotFoundError:
                    raise NotFound(
                        f"NATS server {redact_url(self.url)}: no stream takes the dead-letter"
                        f" subject {self.dead_subject}; create it first: {self.setup_command()}"
                    ) from None
        except BaseException:
            await close_quietly(self._nc)
            raise

    def setup_command(self) -> str:
        return f"onceq nats setup --stream {self.stream} --durable {self.durable} --subject SUBJECT"

    async def start(self) -> None:
        self._pull = Puller(self._nc, self.stream, self.durable, PULL_WAIT, self._changed.set)
        with boundary(self.url, f"consumer {self.durable}"):
            await self._pull.start()
        self._keeper = asyncio.get_running_loop().create_task(self._keep_alive())

    async def _on_disconnected(self) -> None:
        if self._closing or self._down:
            return  # our own close, or an outage already said
        self._down = True
        log.warning(
            "connection to %s lost; reconnecting",
            redact_url(self.url),
            extra={"event": "connection-lost"},
        )

    async def _on_reconnected(self) -> None:
        if self._down:
            self._down = False
            log.warning("reconnected to %s", redact_url(self.url), extra={"event": "reconnected"})

    @property
    def connected(self) -> bool:
        return self._nc is not None and bool(self._nc.is_connected)

    # -- deliveries --------------------------------------------------------------------
    def _room(self) -> int:
        if self.paused:
            return min(self._probes, 1)
        return self.prefetch - len(self._held)

    async def deliveries(self) -> AsyncIterator[Delivery]:
        pull = self._pull
        assert pull is not None, "start() first"
        while True:
            self._changed.clear()
            if self._buffer:
                item = self._buffer.popleft()
                if item is _END:
                    return
                yield item
                continue
            if self.stopped.is_set():
                return
            if pull.arrived:
                msgs, ended = pull.take()
                if msgs:
                    self._arrived(msgs)
                elif ended == "":  # nothing came within PULL_WAIT
                    if self.until_empty and not self._held and await self._drained():
                        self.drained = True
                        return
                elif ended:
                    # A server's status (consumer deleted, a leader change, no JetStream):
                    # wait a moment and ask again; a stop ends the loop meanwhile.
                    log.debug("pull: status %s", ended, extra={"event": "connection-lost"})
                    await self._nap(PULL_WAIT)
                continue
            if pull.open:
                left = pull.deadline - time.monotonic()
                if left > 0:
                    await self._nap(left)
                else:  # its end never came (a reconnect in between): ask again
                    pull.lost()
                continue
            room = self._room()
            if room <= 0:
                await self._changed.wait()
                continue
            try:
                await pull.ask(room)
            except Exception as exc:  # disconnected (nats-py reconnects by itself)
                log.debug("pull: %s", type(exc).__name__, extra={"event": "connection-lost"})
                await self._nap(PULL_WAIT)

    def _arrived(self, msgs: list[Any]) -> None:
        if self.stopped.is_set() or (self.paused and not self._probes):
            # Asked for before the stop (or the pause): never handed out, so given back
            # at once rather than held until AckWait.
            self._give_back_later(msgs)
            return
        if self.paused:
            self._probes = 0
        for msg in msgs:
            self._buffer.append(self._delivery(msg))

    async def _nap(self, seconds: float) -> None:
        """Wait until something arrives, room is made, a stop, or `seconds` pass."""
        wake = asyncio.get_running_loop().call_later(seconds, self._changed.set)
        try:
            await self._changed.wait()
        finally:
            wake.cancel()

    def _delivery(self, msg: Any) -> Delivery:
        headers = msg.headers or {}
        # The ack subject tells the stream sequence and the delivery count:
        # $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ts>.<pending>
        # (nats-py's msg.metadata reads the same, building three objects per copy).
        tokens = msg.reply.split(".")
        at = 4 if len(tokens) == 9 else 6  # the second form has a domain and a hash
        try:
            seq, redelivered = int(tokens[at + 1]), int(tokens[at]) > 1
        except (IndexError, ValueError):  # not an ack subject this parser knows
            seq, redelivered = 0, False
        delivery = Delivery(
            body=msg.data,
            ref=f"{self.stream}/{seq}",
            redelivered=redelivered,
            # The stream sequence names the stored message across redeliveries (a
            # re-published copy gets a new one): a row naming it is this very copy,
            # committed before a crash — recovered, not a duplicate.
            stable_ref=seq > 0,
            token=msg,
            # A replayed dead letter carries its id as Onceq-Msg-Id (its Nats-Msg-Id is
            # its own, so the duplicate window keeps it): onceq._sources.nats.dead.
            headers={
                "message_id": headers.get("Onceq-Msg-Id") or headers.get(MSG_ID),
                "stream_seq": seq,
            },
        )
        self._held[id(delivery)] = [delivery, time.monotonic()]
        return delivery

    def _give_back_later(self, msgs: list[Any]) -> None:
        task = asyncio.get_running_loop().create_task(self._give_back(msgs))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _give_back(self, msgs: list[Any]) -> None:
        for msg in msgs:
            with contextlib.suppress(Exception):
                await msg.nak()

    async def _drained(self) -> bool:
        try:
            with boundary(self.url):
                info = await self._js.consumer_info(self.stream, self.durable)
        except Exception as exc:  # asked again after the next idle pull
            log.debug("drain check: %s", exc, extra={"event": "drain-check-failed"})
            return False
        return not (info.num_pending or info.num_ack_pending or info.num_redelivered)

    async def _keep_alive(self) -> None:
        """+WPI for every copy held over half the AckWait (see the module's docstring)."""
        every = max(self.ack_wait / 4, 0.05)
        while not self._closing:
            await asyncio.sleep(every)
            now = time.monotonic()
            for entry in list(self._held.values()):
                delivery, touched = entry
                if now - touched >= self.ack_wait / 2:
                    entry[1] = now
                    with contextlib.suppress(Exception):  # lost: the server redelivers
                        await delivery.token.in_progress()

    _closing = False

    # -- the breaker's (onceq._core.transport.Pausable) ------------------------------------
    def pause(self) -> None:
        self.paused = True
        self._probes = 0
        # Received and not handed out: back to the stream untried.
        waiting = [d.token for d in self._buffer if d is not _END]
        self._buffer = collections.deque(d for d in self._buffer if d is _END)
        for msg in waiting:
            self._forget(msg)
        if waiting:
            self._give_back_later(waiting)

    def probe(self) -> None:
        self._probes = 1
        self._changed.set()

    def resume(self) -> None:
        self.paused = False
        self._probes = 0
        self._changed.set()

    def _forget(self, msg: Any) -> None:
        for key, (delivery, _) in list(self._held.items()):
            if delivery.token is msg:
                del self._held[key]

    # -- the end ---------------------------------------------------------------------------
    def stop(self) -> None:
        if self.stopped.is_set():
            return
        self.stopped.set()
        self._buffer.append(_END)
        self._changed.set()

    async def close(self) -> None:
        """Let go: every copy still held is given back (NAK), then the connection closes."""
        self._closing = True
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # Everything still held: copies never handed out, and copies handed out whose
        # call never started (a stop) or was cut short (a second signal). Given back at
        # once, as a closing RabbitMQ channel requeues its unacked deliveries, rather
        # than after AckWait; one whose record did commit is acked by the ledger's
        # duplicate check when it comes back.
        left = [entry[0].token for entry in self._held.values()]
        self._held.clear()
        self._buffer.clear()
        pull = self._pull
        if pull is not None:
            # A request still outstanding may bring copies until it ends (a lingering
            # one within PULL_WAIT): they are never handed out either, so wait for its
            # end and give them back too, rather than leave them to AckWait.
            while pull.open and self.connected and time.monotonic() < pull.deadline:
                self._changed.clear()
                left.extend(pull.pending())
                if pull.open:
                    await self._nap(pull.deadline - time.monotonic())
            left.extend(pull.pending())
        if left and self.connected:
            await self._give_back(left)
        if pull is not None:
            with contextlib.suppress(Exception):
                await pull.unsubscribe()
        if self._nc is not None and self.connected:
            with contextlib.suppress(Exception):
                await self._nc.flush(timeout=2)  # the last acks out before the close
        await close_quietly(self._nc)
