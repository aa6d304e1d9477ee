"""A NATS flow's dead letters, read in place from its dead-letter stream.

    onceq nats dead list    → letters(...)     nothing is removed
    onceq nats dead replay  → replay(...)      ledger reset, publish + PubAck, delete
    onceq nats dead purge   → purge(...)       ids recorded, delete

The dead letters are the stored messages of the flow's dead-letter subject (kept by
limits retention, never consumed): read by stream sequence (`get_msg`), so a list
takes nothing and leaves them as they are.

Replay, per dead letter selected, in this order, each step for a reason (as RabbitMQ's):
1. the ledger records the replay (a reset of its attempts) FIRST, so the copy never
   runs with its old attempts; killed here, the letter is still dead and a reset
   with nothing replayed is harmless;
2. a copy is published to the work subject and its PubAck awaited (it carries
   Onceq-Msg-Id: the message's id, and a Nats-Msg-Id of its own, so the work stream's
   duplicate window does not drop it as the original's twin);
3. only then is the dead letter deleted. Killed between 2 and 3: the message is in
   both streams, never in none; the ledger absorbs the twin.
With `rate` (`--rate N`) the copies are paced as RabbitMQ's (onceq._sources.pace), and
the ledger records about a second of them at a time, each batch before its copies.
Purge records the ids it is about to delete (`record_purged`) before deleting them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from onceq._sources.dead_api import DeadItem
from onceq._sources.nats.connect import API_TIMEOUT, boundary, close_quietly, connect
from onceq._sources.nats.names import dead_subject_of
from onceq._sources.nats.settle import MSG_ID, REASON
from onceq._sources.pace import Pacer, paced_batch
from onceq.errors import NotFound

TRANSPORT = "nats"


@dataclass(frozen=True)
class Letter:
    seq: int
    msg_id: str | None
    reason: str
    body: bytes
    headers: dict[str, str]

    @property
    def key(self) -> str:
        """What selects it (the console's DeadSelection): its id, else its sequence."""
        return self.msg_id or f"seq-{self.seq}"


@dataclass
class Selection:
    """--all, --id ID (repeatable) or --reason R."""

    all: bool = False
    ids: tuple[str, ...] = ()
    reason: str | None = None

    def matches(self, letter: Letter) -> bool:
        if self.ids:
            return letter.key in self.ids
        if self.reason is not None:
            return letter.reason == self.reason
        return True

    def as_filter(self) -> dict[str, Any]:
        return {"all": self.all, "ids": list(self.ids), "reason": self.reason}


@dataclass
class DeadReport:
    letters: list[dict[str, Any]] = field(default_factory=list)
    replayed: int = 0
    purged: int = 0
    dry_run: bool = False
    op: int | None = None
    declined: bool = False  # the purge's question was answered no: nothing changed

    def as_dict(self) -> dict[str, Any]:
        return {
            "letters": self.letters,
            "replayed": self.replayed,
            "purged": self.purged,
            "dry_run": self.dry_run,
            "declined": self.declined,
            "op": self.op,
        }


class DeadStream:
    """The flow's dead-letter stream and its work subject, on a connection of its own."""

    def __init__(self, url: str, source: Any) -> None:
        self.url = url
        self.source = source
        self.subject = source.dead_subject or dead_subject_of(source.stream)
        self.name = ""
        self.work_subject = ""
        self._nc: Any = None
        self._js: Any = None

    async def __aenter__(self) -> DeadStream:
        import nats.js.errors as jse

        self._nc = await connect(self.url)
        self._js = self._nc.jetstream(timeout=API_TIMEOUT)
        try:
            with boundary(self.url, f"consumer {self.source.durable}"):
                try:
                    info = await self._js.consumer_info(self.source.stream, self.source.durable)
                    self.name = await self._js.find_stream_name_by_subject(self.subject)
                except jse.NotFoundError:
                    raise NotFound(
                        f"no consumer {self.source.durable} on stream {self.source.stream}, or"
                        f" no stream takes {self.subject} (onceq nats setup makes them)"
                    ) from None
            self.work_subject = info.config.filter_subject or self.source.subject or ""
        except BaseException:
            await close_quietly(self._nc)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await close_quietly(self._nc)

    async def letters(self) -> list[Letter]:
        import nats.js.errors as jse

        with boundary(self.url, f"stream {self.name}"):
            state = (await self._js.stream_info(self.name)).state
            out: list[Letter] = []
            if not state.messages:
                return out
            for seq in range(state.first_seq, state.last_seq + 1):
                try:
                    msg = await self._js.get_msg(self.name, seq)
                except jse.NotFoundError:
                    continue  # deleted (replayed or purged)
                if msg.subject != self.subject:
                    continue
                headers = dict(msg.headers or {})
                out.append(
                    Letter(
                        seq,
                        # Not the dead copy's Nats-Msg-Id: that names the stored original
                        # (STREAM:SEQ, onceq._sources.nats.settle), not the message.
                        headers.get(MSG_ID),
                        headers.get(REASON, ""),
                        msg.data or b"",
                        headers,
                    )
                )
            return out

    async def publish(self, letter: Letter, op: int | None) -> None:
        headers = {
            k: v for k, v in letter.headers.items() if not k.startswith(("Nats-", "Onceq-Dead-"))
        }
        if letter.msg_id:
            headers[MSG_ID] = letter.msg_id
        headers["Nats-Msg-Id"] = f"replay:{self.name}:{letter.seq}:{op}"
        with boundary(self.url, f"subject {self.work_subject}"):
            await self._js.publish(self.work_subject, letter.body, headers=headers)

    async def delete(self, letter: Letter) -> None:
        with boundary(self.url, f"stream {self.name}"):
            await self._js.delete_msg(self.name, letter.seq)


def _row(letter: Letter, info: dict[str, Any]) -> dict[str, Any]:
    return {
        "seq": letter.seq,
        "msg_id": letter.msg_id,
        "reason": letter.reason,
        "attempts": info.get("attempts"),
        "bytes": len(letter.body),
    }


async def run(
    action: str,
    url: str,
    source: Any,
    ledger: Any,
    selection: Any,  # Selection, or the console's DeadSelection: .matches(letter), .as_filter()
    *,
    dry_run: bool = False,
    queue: Callable[[DeadStream], str] = lambda d: d.name,
    confirm: Callable[[int], bool] | None = None,
    rate: float | None = None,
) -> DeadReport:
    """list | replay | purge the selected dead letters (see the module's docstring).

    `confirm(n)` is asked, once the n selected letters are counted, before anything
    changes (None: yes); a no returns the report with `declined` set, nothing changed.
    `rate`: a replay publishes at most that many copies per second (onceq._sources.pace)."""
    report = DeadReport(dry_run=dry_run)
    async with DeadStream(url, source) as dead:
        chosen = [x for x in await dead.letters() if selection.matches(x)]
        info = ledger.dead_info([x.msg_id for x in chosen if x.msg_id]) if ledger else {}
        report.letters = [_row(x, info.get(x.msg_id or "", {})) for x in chosen]
        if action == "list" or dry_run or not chosen:
            return report
        if confirm is not None and not await asyncio.to_thread(confirm, len(chosen)):
            report.declined = True
            return report
        report.op = ledger.start_op(TRANSPORT, action, selection.as_filter(), queue(dead))
        try:
            if action == "replay":
                pacer = Pacer(rate)
                size = paced_batch(rate, len(chosen))
                for i in range(0, len(chosen), size):
                    some = chosen[i : i + size]
                    ledger.record_replays(
                        report.op, [(f"{dead.name}/{x.seq}", x.msg_id) for x in some]
                    )
                    for letter in some:
                        await pacer.wait()
                        await dead.publish(letter, report.op)
                        await dead.delete(letter)
                        report.replayed += 1
            else:
                ledger.record_purged(
                    report.op, [x.msg_id or f"{dead.name}/{x.seq}" for x in chosen]
                )
                for letter in chosen:
                    await dead.delete(letter)
                    report.purged += 1
        finally:
            ledger.finish_op(report.op)
    return report


async def items(
    url: str, source: Any, ledger: Any, selection: Any, *, bodies: bool = False
) -> list[DeadItem]:
    """The console's view (onceq._sources.dead_api): the selected letters, left in place."""
    async with DeadStream(url, source) as dead:
        chosen = [x for x in await dead.letters() if selection.matches(x)]
        info = ledger.dead_info([x.msg_id for x in chosen if x.msg_id]) if ledger else {}
        out = []
        for x in chosen:
            i = info.get(x.msg_id or "", {})
            out.append(
                DeadItem(
                    key=x.key,
                    msg_id=x.msg_id,
                    reason=i.get("reason") or x.reason or "unknown",
                    detail=i.get("detail"),
                    attempts=i.get("attempts"),
                    died_at=i.get("at"),
                    size=len(x.body),
                    where=dead.name,
                    body=x.body if bodies else None,
                    # Header names only: a value may be a secret a publisher sent.
                    properties={"seq": x.seq, "headers": sorted(x.headers)},
                )
            )
        return out
