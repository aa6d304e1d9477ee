"""What the console knows and does, apart from HTTP: the flows, the ledger, the actions.

Every read goes through the code the commands use (status's gather, trace's journeys,
each source type's dead letters); every change through the source type's own replay
or purge (`onceq._sources.dead_api`), with these guards of its own:

- **One action per flow at a time** (an asyncio lock): two clicks cannot interleave.
- **Confirmed count.** An action says how many dead letters its operator saw
  (`expect`); if the selection matches another number when it runs, nothing is done
  and the answer says so (the queue changed under the dialog).
- **A double submit does nothing twice.** Each action carries the page's request id;
  the answer of a request id already done is given again without doing anything.
  And the selection is matched when the action runs, so even a new request for what
  was just replayed finds nothing dead to replay.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from onceq._console.history import History
from onceq._ledger.target import describe, open_ledger
from onceq._ops.journey import trace
from onceq._ops.ledger_read import NoLedger
from onceq._ops.status import gather_async
from onceq._sources import registry
from onceq._sources.dead_api import DeadAction, DeadItem, DeadSelection
from onceq.errors import Conflict, NotFound, OnceqError, UsageError

BODY_LIMIT = 64 * 1024  # bytes of a body the page is given; the rest is cut, with a note
REMEMBERED = 1000  # request ids whose answers are kept for a double submit


class ConsoleState:
    def __init__(
        self,
        flows: Sequence[Any],
        ledger: str | Path,
        *,
        read_only: bool = False,
        management_api: str | None = None,
    ) -> None:
        self.flows = {f.name: f for f in flows}
        self.ledger = ledger
        self.read_only = read_only
        self.api = management_api
        self.history = History()
        self._locks: dict[str, asyncio.Lock] = {}
        self._answers: OrderedDict[str, dict[str, Any]] = OrderedDict()

    # -- reads ---------------------------------------------------------------------------
    async def overview(self) -> dict[str, Any]:
        doc = await gather_async(list(self.flows.values()), self.ledger, api=self.api)
        for name, entry in doc["flows"].items():
            self.history.add(name, entry.get("ledger"))
            entry["rates"] = self.history.rates(name)
            entry["actions"] = [] if self.read_only else sorted(self._type(name).dead_actions)
            # The page's depth columns, labelled by the flow's source type (whatever its kind).
            queue = entry.get("queue")
            entry["depths"] = self._type(name).labelled_depths(queue) if queue else []
        doc["read_only"] = self.read_only
        return doc

    async def failures(self) -> dict[str, Any]:
        """Dead letters grouped by (flow, reason): count, first and last death."""
        groups: list[dict[str, Any]] = []
        errors: dict[str, str] = {}
        for name in self.flows:
            try:
                found = await self.items(name, DeadSelection())
            except OnceqError as exc:
                errors[name] = str(exc)
                continue
            by_reason: dict[str, list[DeadItem]] = {}
            for item in found:
                by_reason.setdefault(item.reason, []).append(item)
            for reason, items in sorted(by_reason.items()):
                times = sorted(t for t in (i.died_at for i in items) if t)
                groups.append(
                    {
                        "flow": name,
                        "reason": reason,
                        "count": len(items),
                        "first": times[0] if times else None,
                        "last": times[-1] if times else None,
                        "where": items[0].where,
                    }
                )
        groups.sort(key=lambda g: (-g["count"], g["flow"], g["reason"]))
        return {"groups": groups, "errors": errors}

    async def items(
        self, flow: str, selection: DeadSelection, *, bodies: bool = False
    ) -> list[DeadItem]:
        f = self._flow(flow)
        with self._book(f) as book:
            return await self._type(flow).dead_items(f, book, selection, bodies=bodies)

    async def message(self, flow: str, key: str) -> dict[str, Any]:
        found = await self.items(flow, DeadSelection(keys=(key,)), bodies=True)
        if not found:
            raise NotFound(f"{flow}: no dead letter {key!r} (replayed or purged since?)")
        item = found[0]
        doc = item.as_dict()
        doc.update(_body(item.body or b""))
        doc["journeys"] = await self.journeys(item.msg_id or key, [flow])
        return doc

    async def journeys(self, msg_id: str, flows: Sequence[str] = ()) -> list[dict[str, Any]]:
        try:
            found = await asyncio.to_thread(trace, self.ledger, msg_id, flows)
        except NoLedger:
            return []
        return [j.as_dict() for j in found]

    # -- changes -------------------------------------------------------------------------
    async def act(
        self, action: str, flow: str, selection: DeadSelection, expect: int, request_id: str
    ) -> dict[str, Any]:
        if self.read_only:
            raise UsageError("this console is read-only")
        if request_id in self._answers:
            return {**self._answers[request_id], "repeated": True}
        st = self._type(flow)
        if action not in st.dead_actions:
            raise UsageError(f"{flow}: a {st.kind} flow's dead letters cannot be {action}d here")
        f = self._flow(flow)
        lock = self._locks.setdefault(flow, asyncio.Lock())
        async with lock:
            if request_id in self._answers:  # the twin request finished while we waited
                return {**self._answers[request_id], "repeated": True}
            now = len(await self.items(flow, selection))
            if now != expect:
                raise Conflict(
                    f"{flow}: {now} dead letter(s) match now, {expect} were confirmed;"
                    " nothing done (look again)"
                )
            with self._book(f) as book:
                result: DeadAction = await st.dead_action(action, f, book, selection)
        answer = {**result.as_dict(), "flow": flow, "repeated": False}
        self._answers[request_id] = answer
        while len(self._answers) > REMEMBERED:
            self._answers.popitem(last=False)
        return answer

    # -- helpers -------------------------------------------------------------------------
    def _flow(self, name: str) -> Any:
        try:
            return self.flows[name]
        except KeyError:
            raise NotFound(f"no flow {name!r} in this console") from None

    def _type(self, name: str) -> registry.SourceType:
        st = registry.of(self._flow(name).source)
        if st is None:
            raise NotFound(f"{name}: not a source the console can read")
        return st

    def _book(self, flow: Any) -> Any:
        # Never created: a console on a wrong ledger must say so, not make an empty one.
        # The source tag is written only by a consumer's commits, which the console
        # never makes (a replay writes its own transport in dead_ops).
        try:
            return open_ledger(self.ledger, flow=flow.name, create=False)
        except NotFound:
            raise NotFound(f"{describe(self.ledger)}: no ledger here") from None


def _body(body: bytes) -> dict[str, Any]:
    """The body as the page shows it: text (never HTML), pretty JSON when it is JSON,
    cut at BODY_LIMIT bytes with a note."""
    cut = len(body) > BODY_LIMIT
    shown = body[:BODY_LIMIT].decode("utf-8", errors="replace")
    pretty = None
    if not cut:
        try:
            pretty = json.dumps(json.loads(body), indent=2, ensure_ascii=False)
        except ValueError:
            pretty = None
    return {
        "body": pretty if pretty is not None else shown,
        "body_json": pretty is not None,
        "body_cut": f"cut at {BODY_LIMIT} of {len(body)} bytes" if cut else None,
    }
