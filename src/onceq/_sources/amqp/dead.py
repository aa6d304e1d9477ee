"""A RabbitMQ flow's dead letters: list them in place, replay them, purge them.

    onceq mq dead list    → browse(...)  → DeadReport   nothing is removed
    onceq mq dead show    → browse(..., bodies=True)    the same, bodies kept
    onceq mq dead replay  → replay(...)  → DeadReport   ledger reset, publish + confirm, ack
    onceq mq dead purge   → purge(...)   → DeadReport   ledger audit, ack

Looking without taking: every command reads the dead-letter queue with basic.get and
manual acks on a channel of its own, up to the number of messages the queue held when
it started (what arrives later is behind them, and is left for the next command). A
message got and not acked stays ours, so the next get returns the next message; when
the channel closes (or the connection drops, or the process is killed) the broker puts
every unacked one back. RabbitMQ puts a requeued message back at its original position
in the queue when it can (its "Negative Acknowledgements" guide: "if possible"; closer
to the head when other consumers took messages of the same queue meanwhile), so a
list, a dry run, or the letters a replay does not select leave the queue in its order.

Replay, per dead letter selected, in this order, each step for a reason:
1. the ledger records the replay (`Ledger.record_replays`: a replays row whose
   reset_after makes its earlier failures no longer count) — FIRST, so a copy never
   runs with its old attempts (it would die again at its first failure). Killed
   right after: the dead letter is still dead; a reset with nothing replayed is
   harmless, and the next replay records another.
2. a copy is published to the work exchange with the work routing key: persistent,
   mandatory (no queue bound → returned, not dropped), confirmed;
3. only once the broker confirmed the copy, the dead copy is acked. Killed between 2
   and 3: the message is in both queues, never in none; the ledger absorbs the twin
   (a copy of an id already processed is acked as a duplicate, without a call).
Purge records the ids it is about to delete (`Ledger.record_purged`) before it acks
them: a killed purge may list an id still in the queue, never delete an unlisted one.

A channel holding unacked deliveries for longer than the broker's consumer_timeout
(30 min by default) is closed by the broker: a replay paced by --rate over that long
stops with an error (exit 7); what it had not acked goes back to the queue.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

from onceq._sources.amqp.dead_body import NewBody
from onceq._sources.amqp.dead_letter import (
    DeadLetter,
    DeadReport,
    Selection,
    copy_id_of,
    deaths_of,
    msg_id_of,
    replay_properties,
    republish_problem,
)
from onceq._sources.amqp.topology import QUEUE, Topology
from onceq._sources.amqp.url import CONNECT_TIMEOUT, boundary, close_quietly, connect
from onceq._sources.amqp.wire import install, verdict
from onceq._sources.pace import Pacer, paced_batch
from onceq.errors import NotFound, Unroutable

# Dead letters got per round: their ledger rows are read in one query and, for a
# replay, their resets written in one transaction (one fsync per batch, not per letter).
BATCH = 100
# Seconds the channel stays open after its acks were answered (`DeadQueue.settle`).
ACK_GRACE_S = 0.5
TRANSPORT = "amqp"


class DeadQueue:
    """A flow's dead-letter queue, browsed on a channel of our own (see the module doc).

    `target`: also check the work exchange and queue, and open a confirming publisher
    channel (replay). Everything is checked before anything is got: a refused command
    changes nothing.
    """

    def __init__(self, url: str, topology: Topology, *, target: bool = False) -> None:
        self.url = url
        self.topology = topology
        self.target = target
        self.total = 0
        self._conn: Any = None
        self._get: Any = None
        self._pub: Any = None

    async def __aenter__(self) -> DeadQueue:

        # A dead letter whose properties are malformed (dead-lettered for them: the
        # broker's copy carries them too) must be listed, not drop the connection.
        install()
        self._conn = await connect(self.url)
        try:
            t = self.topology
            self.total = await self._check("queue", t.dead_letter_queue)
            if self.target:
                await self._check("exchange", t.exchange)
                await self._check("queue", t.queue)
            with boundary(self.url, f"queue {t.dead_letter_queue}"):
                self._get = await self._conn.channel()
                if self.target:
                    # on_return_raises: a mandatory copy the broker returns (no queue
                    # bound for the key) fails its confirm instead of passing as an ack.
                    self._pub = await self._conn.channel(
                        publisher_confirms=True, on_return_raises=True
                    )
        except BaseException:
            await close_quietly(self._conn)
            raise
        return self

    async def _check(self, kind: str, name: str) -> int:
        """A passive declare on a throwaway channel (a 404 closes the channel it is on)."""
        label = f"{kind} {name}" if name or kind == "queue" else "the default exchange"
        if kind == "exchange" and not name:
            return 0  # the default exchange always exists
        try:
            with boundary(self.url, label):
                channel = await self._conn.channel()
                if kind == "queue":
                    ok = await channel.queue_declare(name, passive=True)
                    count = int(ok.message_count)
                else:
                    await channel.exchange_declare(name, passive=True)
                    count = 0
                await channel.close()
                return count
        except NotFound as exc:
            raise NotFound(f"{exc}; declare it first: {self._declare_hint()}") from None

    def _declare_hint(self) -> str:
        t = self.topology
        if t == Topology.claims():
            return "onceq mq topology"
        return "onceq mq topology" + ("" if t.queue == QUEUE else f" --queue {t.queue}")

    async def __aexit__(self, *exc: object) -> None:
        # Closing the get channel hands every unacked (unselected) letter back.
        await close_quietly(self._conn)

    async def batches(
        self, id_field: str | None, info: Callable[[list[str]], dict[str, dict[str, Any]]]
    ) -> AsyncIterator[list[DeadLetter]]:
        """The dead letters, head first, in batches, each with its ledger info."""
        from pamqp.commands import Basic

        position = 0
        queue = self.topology.dead_letter_queue
        while position < self.total:
            batch: list[DeadLetter] = []
            with boundary(self.url, f"queue {queue}"):
                while len(batch) < BATCH and position < self.total:
                    m = await self._get.basic_get(queue, no_ack=False, timeout=CONNECT_TIMEOUT)
                    if isinstance(m.delivery, Basic.GetEmpty):
                        self.total = position  # another consumer took the rest
                        break
                    batch.append(_letter(position, m, id_field))
                    position += 1
            if not batch:
                return
            found = info(sorted({x.msg_id for x in batch if x.msg_id is not None}))
            for letter in batch:
                letter.info = found.get(letter.msg_id) if letter.msg_id is not None else None
            yield batch

    async def ack(self, letter: DeadLetter) -> None:
        with boundary(self.url, f"queue {self.topology.dead_letter_queue}"):
            await self._get.basic_ack(letter.tag)

    async def publish(self, letter: DeadLetter) -> None:
        """A copy to the work exchange/key; returns once the broker confirmed it."""
        import aiormq.exceptions as ae
        from pamqp.commands import Basic

        t = self.topology
        login = unquote(urlsplit(self.url).username or "guest")
        # A channel the broker closed meanwhile (consumer_timeout, an outage) is a
        # broker error, one line (exit 7): the dead copy was not acked, it stays.
        with boundary(self.url, f"exchange {t.exchange}"):
            try:
                confirm = await self._pub.basic_publish(
                    letter.body,
                    exchange=t.exchange,
                    routing_key=t.routing_key,
                    properties=replay_properties(letter, login),
                    mandatory=True,
                    timeout=CONNECT_TIMEOUT,
                )
            except ae.PublishError:
                raise Unroutable(
                    f"exchange {t.exchange}: returned the replayed copy as unroutable (no"
                    f" queue bound for key {t.routing_key!r}); it stays in {t.dead_letter_queue}"
                ) from None
            except ae.DeliveryError:
                confirm = None
        if not isinstance(confirm, Basic.Ack):
            raise Unroutable(
                f"exchange {t.exchange}: the broker refused (nacked) the replayed copy;"
                f" it stays in {t.dead_letter_queue}"
            )

    async def settle(self) -> None:
        """Wait until every ack sent is processed: a synchronous method on the same
        channel is answered only after the methods before it (AMQP orders a channel).

        Then a moment more before the channel closes: a quorum queue applies the
        channel's acks as commands of its own, after the channel answered, and a close
        that reaches the queue first hands those letters back as if never acked
        (rabbitmq-server#10327: 6 of 39 purged letters stayed, about one run in ten of
        tests/integration/test_mq_quorum.py). Not a guarantee, a narrower window; a
        letter handed back is still there, never lost, and a second purge takes it."""
        with boundary(self.url, f"queue {self.topology.dead_letter_queue}"):
            await self._get.basic_qos(prefetch_count=0, timeout=CONNECT_TIMEOUT)
        await asyncio.sleep(ACK_GRACE_S)


def _letter(position: int, m: Any, id_field: str | None) -> DeadLetter:
    props = m.header.properties
    headers = props.headers if isinstance(props.headers, dict) else {}
    return DeadLetter(
        position=position,
        msg_id=msg_id_of(props.message_id, m.body, id_field),
        size=len(m.body),
        deaths=deaths_of(headers),
        tag=m.delivery.delivery_tag,
        properties=props,
        body=m.body,
        copy_id=copy_id_of(headers),
        refused=verdict(props),
    )


async def browse(
    url: str,
    topology: Topology,
    ledger: Any,
    selection: Selection,
    *,
    id_field: str | None = None,
    limit: int | None = None,
    bodies: bool = False,
) -> DeadReport:
    """The dead letters `selection` matches (at most `limit`), all left in the queue;
    with `bodies`, each with its body (`show`), else its size only."""
    report = DeadReport("list", topology, selection)
    async with DeadQueue(url, topology) as dq:
        report.total = dq.total
        async for batch in dq.batches(id_field, ledger.dead_info):
            report.seen += len(batch)
            for letter in batch:
                if selection.matches(letter):
                    if not bodies:
                        letter.body = b""  # only its size is shown
                    report.matched.append(letter)
                    if limit is not None and len(report.matched) >= limit:
                        return report
    return report


async def replay(
    url: str,
    topology: Topology,
    ledger: Any,
    selection: Selection,
    *,
    id_field: str | None = None,
    dry_run: bool = False,
    rate: float | None = None,
    body: NewBody | None = None,
) -> DeadReport:
    """Move the selected dead letters back to the work exchange (see the module doc).

    `body` (`--body FILE`, one --id, checked by onceq._sources.amqp.dead_body before this is
    called): each copy carries it instead of the dead letter's body — the same steps,
    the same order; the dead letter is acked only once its corrected copy is confirmed.
    """
    report = DeadReport("replay", topology, selection, dry_run=dry_run, body=body)
    started = time.monotonic()
    size = paced_batch(rate, BATCH)
    pacer = Pacer(rate)
    async with DeadQueue(url, topology, target=True) as dq:
        report.total = dq.total
        try:
            async for batch in dq.batches(id_field, ledger.dead_info):
                report.seen += len(batch)
                chosen = [x for x in batch if selection.matches(x)]
                report.matched += chosen
                if dry_run:
                    continue
                for i in range(0, len(chosen), size):
                    await _replay_some(dq, ledger, report, chosen[i : i + size], pacer)
            await dq.settle()
        finally:
            if report.op is not None:
                ledger.finish_op(report.op)
            report.seconds = time.monotonic() - started
    return report


async def _replay_some(
    dq: DeadQueue, ledger: Any, report: DeadReport, letters: Sequence[DeadLetter], pacer: Pacer
) -> None:
    t = dq.topology
    ok = []
    for letter in letters:
        why = republish_problem(letter)
        if why:
            report.skipped.append((letter, why))  # left unacked: it stays where it is
        else:
            ok.append(letter)
    if not ok:
        return
    if report.op is None:
        what = report.selection.as_dict()
        if report.body is not None:  # the audit says the body was replaced, and by what
            what["body"] = report.body.as_dict()
        report.op = ledger.start_op(TRANSPORT, "replay", what, t.dead_letter_queue)
    ledger.record_replays(report.op, [(x.ref(t.queue, t.dead_letter_queue), x.msg_id) for x in ok])

    async def one(letter: DeadLetter) -> None:
        if report.body is not None:
            letter.body = report.body.data
        await dq.publish(letter)
        await dq.ack(letter)  # only after the confirm: never lost, at worst twice
        report.done.append(letter)

    tasks = []
    for letter in ok:
        await pacer.wait()
        tasks.append(asyncio.create_task(one(letter)))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    failure = next((r for r in results if isinstance(r, BaseException)), None)
    if failure is not None:
        raise failure


async def purge(
    url: str,
    topology: Topology,
    ledger: Any,
    selection: Selection,
    *,
    id_field: str | None = None,
    dry_run: bool = False,
    confirm: Callable[[list[DeadLetter]], bool] | None = None,
) -> DeadReport:
    """Delete the selected dead letters, once `confirm(selected)` says yes (None: yes).

    Every selected letter is held (unacked) while the question is asked, so what is
    deleted is exactly what was counted; a no leaves the queue as it was.
    """
    report = DeadReport("purge", topology, selection, dry_run=dry_run)
    started = time.monotonic()
    async with DeadQueue(url, topology) as dq:
        report.total = dq.total
        async for batch in dq.batches(id_field, ledger.dead_info):
            report.seen += len(batch)
            report.matched += [x for x in batch if selection.matches(x)]
        if dry_run or not report.matched:
            report.seconds = time.monotonic() - started
            return report
        if confirm is not None and not await asyncio.to_thread(confirm, report.matched):
            report.declined = True
            report.seconds = time.monotonic() - started
            return report
        report.op = ledger.start_op(
            TRANSPORT, "purge", selection.as_dict(), topology.dead_letter_queue
        )
        try:
            for i in range(0, len(report.matched), BATCH):
                some = report.matched[i : i + BATCH]
                ledger.record_purged(
                    report.op,
                    [x.msg_id or x.ref(topology.queue, topology.dead_letter_queue) for x in some],
                )
                for letter in some:
                    await dq.ack(letter)
                    report.done.append(letter)
            await dq.settle()
        finally:
            ledger.finish_op(report.op)
            report.seconds = time.monotonic() - started
    return report
