"""One dead letter as `onceq mq dead` sees it, which of them a command selects, and
what a command reports.

No broker, no ledger here: `onceq._sources.amqp.dead` fills these from basic.get and
`Ledger.dead_info`, and builds a replayed copy's properties with `replay_properties`.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from onceq._core.fields import get_path
from onceq._core.fields import split_path as _split
from onceq._core.retry import parse_duration
from onceq._core.values import text
from onceq._sources.amqp.topology import Topology
from onceq._sources.amqp.transport import COPY_HEADER
from onceq._sources.amqp.wire import verdict
from onceq.errors import UsageError

# The reason of a dead letter the ledger has no 'dead' row for (dead-lettered by
# another consumer, published into the dead-letter queue by hand, another ledger).
UNKNOWN = "unknown"
# Headers the broker writes when it dead-letters a message. A replayed copy goes out
# without them: RabbitMQ 3.13.3+ (and 3.12 and older) interpret an x-death a client
# publishes and would go on counting from it, 3.13.0-3.13.2 and 4.x ignore it ("x-
# headers belong to the broker"); a replayed message starts afresh in the ledger
# (its attempts are reset), so its broker history starts afresh too, on every version.
# The history is not lost: the ledger keeps every failure row, and ONCEQ_REPLAYS counts
# the replays in a header of our own (4.0's advice: a custom non-x- header).
BROKER_HEADERS = ("x-death",)
BROKER_HEADER_PREFIXES = ("x-first-death-", "x-last-death-")
REPLAYS_HEADER = "onceq-replays"


@dataclass(frozen=True)
class Death:
    """One entry of x-death: the broker dead-lettered it `count` times from `queue`."""

    queue: str
    reason: str
    count: int
    time: datetime | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": text(self.queue),
            "reason": text(self.reason),
            "count": self.count,
            "time": self.time.isoformat() if self.time else None,
        }


def deaths_of(headers: dict[str, Any] | None) -> list[Death]:
    """The x-death entries, newest first (the broker's order); [] when there are none.

    Read defensively: a client can publish any x-death it likes (3.x keeps it).
    """
    raw = (headers or {}).get("x-death")
    if not isinstance(raw, list):
        return []
    out = []
    for entry in raw:
        if not isinstance(entry, dict):
            continue
        when = entry.get("time")
        count = entry.get("count")
        out.append(
            Death(
                queue=str(entry.get("queue", "")),
                reason=str(entry.get("reason", "")),
                count=count if isinstance(count, int) and not isinstance(count, bool) else 0,
                time=when if isinstance(when, datetime) else None,
            )
        )
    return out


def msg_id_of(message_id: Any, body: bytes, id_field: str | None) -> str | None:
    """The consumer's id rule: the message_id property, else the body's `id_field`.

    None when neither gives a usable id: such a message was dead-lettered by the
    decoder (missing-id, bad-id, parse) and the ledger knows it by no id.
    """
    if isinstance(message_id, str) and message_id.strip():
        return message_id
    if id_field is None:
        return None
    try:
        doc = json.loads(body.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    value = get_path(doc, _split(id_field, "id_field"))
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    value = str(value)
    return value if value.strip() else None


@dataclass
class DeadLetter:
    """A message of the dead-letter queue; `position` 0 is its head.

    `info` is the ledger's newest 'dead' failure of its msg_id (reason, detail, at,
    attempts) or None. `tag`, `properties` and `body` are what replay and purge need.
    """

    position: int
    msg_id: str | None
    size: int
    deaths: list[Death]
    info: dict[str, Any] | None = None
    tag: int = 0
    properties: Any = field(default=None, repr=False)
    body: bytes = field(default=b"", repr=False)
    copy_id: str | None = None
    # (reason, detail) when its properties are malformed (`onceq._sources.amqp.wire.verdict`): the
    # consumer dead-lettered it for exactly that, and a replay would only do so again.
    refused: tuple[str, str] | None = None

    @property
    def reason(self) -> str:
        """Malformed: the wire's reason (the consumer's, whatever the ledger holds for the
        id); else the ledger's; else unknown."""
        if self.refused is not None:
            return self.refused[0]
        return str(self.info["reason"]) if self.info else UNKNOWN

    @property
    def detail(self) -> str | None:
        if self.refused is not None:
            return self.refused[1]
        return self.info.get("detail") if self.info else None

    @property
    def attempts(self) -> int | None:
        return int(self.info["attempts"]) if self.info else None

    @property
    def dead_at(self) -> datetime | None:
        """When it died: the ledger's time, else the broker's newest x-death time."""
        if self.info and self.info.get("at"):
            try:
                return _aware(datetime.fromisoformat(str(self.info["at"])))
            except ValueError:
                pass
        times = [d.time for d in self.deaths if d.time is not None]
        return _aware(max(times)) if times else None

    def ref(self, work_queue: str, dead_queue: str) -> str:
        """The ref the consumer gives this message's copy (`AmqpTransport._on_message`):
        work_queue/<x-onceq-copy>. A replays row under that ref tells the consumer that a
        dead row of the same ref is older than the replay (`failure_recorded`)."""
        if self.copy_id is not None:
            return f"{work_queue}/{self.copy_id}"
        return f"{dead_queue}/{text(self.msg_id) or '?'}"

    def as_dict(self) -> dict[str, Any]:
        when = self.dead_at
        return {
            "position": self.position,
            "message_id": text(self.msg_id),
            "reason": self.reason,
            "detail": self.detail,
            "attempts": self.attempts,
            "dead_at": when.isoformat() if when else None,
            "in_ledger": self.info is not None,
            "x_death": [d.as_dict() for d in self.deaths],
            "size": self.size,
        }


def _aware(when: datetime) -> datetime:
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def parse_since(value: str, now: datetime | None = None) -> datetime:
    """--since: a duration back from now (90s, 15m, 1h) or an ISO time (UTC if no zone)."""
    now = now or datetime.now(UTC)
    try:
        return now - timedelta(seconds=parse_duration(value, "--since"))
    except UsageError:
        pass
    try:
        return _aware(datetime.fromisoformat(value))
    except ValueError:
        raise UsageError(
            f"--since: {value!r}: not a duration (30m, 1h, 2d) or an ISO time"
            " (2026-11-30T12:00:00Z)"
        ) from None


@dataclass(frozen=True)
class Selection:
    """Which dead letters a command takes: all, some ids, one reason (and a time bound).

    `ids` and `reason` match the ledger's msg_id and dead reason (UNKNOWN for a
    message the ledger has no dead row for); `since` the time it died.
    """

    all: bool = False
    ids: tuple[str, ...] = ()
    reason: str | None = None
    since: datetime | None = None

    @classmethod
    def for_change(cls, all_: bool, ids: tuple[str, ...], reason: str | None) -> Selection:
        """replay/purge: exactly one of --all, --id, --reason (a change is never implicit)."""
        given = [name for name, v in (("--all", all_), ("--id", ids), ("--reason", reason)) if v]
        if not given:
            raise UsageError("give --all, --id ID… or --reason R: which dead letters to take")
        if len(given) > 1:
            raise UsageError(f"{' and '.join(given)}: give one of --all, --id, --reason")
        if reason is not None and not reason.strip():
            raise UsageError("--reason: '' names no reason")
        return cls(all=all_, ids=tuple(dict.fromkeys(ids)), reason=reason)

    def matches(self, letter: DeadLetter) -> bool:
        if self.ids and letter.msg_id not in self.ids:
            return False
        if self.reason is not None and letter.reason != self.reason:
            return False
        if self.since is not None:
            when = letter.dead_at
            if when is None or when < self.since:
                return False
        return True

    def as_dict(self) -> dict[str, Any]:
        """The filter as given, for the ledger's dead_ops.filter."""
        out: dict[str, Any] = {}
        if self.all:
            out["all"] = True
        if self.ids:
            out["ids"] = list(self.ids)
        if self.reason is not None:
            out["reason"] = self.reason
        if self.since is not None:
            out["since"] = self.since.isoformat()
        return out

    def describe(self) -> str:
        parts = []
        if self.ids:
            parts.append(f"id {', '.join(self.ids)}")
        if self.reason is not None:
            parts.append(f"reason {self.reason}")
        if self.since is not None:
            parts.append(f"since {self.since.isoformat(timespec='seconds')}")
        return "; ".join(parts) or "all"


def republish_problem(letter: DeadLetter) -> str:
    """Why this dead letter cannot go out again as it is, or ''.

    Malformed properties (a message_id or a header that is not UTF-8 …: what the
    consumer dead-lettered it for, `onceq._sources.amqp.wire`) cannot be sent again unchanged,
    and a replay would only dead-letter it once more. Anything else the encoder
    refuses is named too, so the letter stays where it is instead of the command
    failing half-way.
    """
    # The listing fills `refused`; a letter made another way is asked the same question.
    refused = letter.refused if letter.refused is not None else verdict(letter.properties)
    if refused is not None:
        return refused[1]
    try:
        replay_properties(letter, None).marshal()
    except Exception as exc:  # whatever pamqp's encoder refuses: that letter's problem
        return f"its properties cannot be encoded again ({type(exc).__name__})"
    return ""


def replay_properties(letter: DeadLetter, login: str | None) -> Any:
    """The properties of a replayed copy: the dead letter's, kept, with these changes.

    - persistent (delivery_mode 2): the copy must survive a broker restart, whatever
      the original said, since the dead copy is acked once it is confirmed;
    - the broker's dead-letter headers removed (see BROKER_HEADERS), x-onceq-copy and
      every other header kept, onceq-replays counted up;
    - user_id kept only when it is ours: RabbitMQ refuses a publish whose user_id is
      not the connection's user (406 closes the channel).
    """
    props = copy.copy(letter.properties)
    headers = {
        k: v
        for k, v in (props.headers or {}).items()
        if k not in BROKER_HEADERS and not k.startswith(BROKER_HEADER_PREFIXES)
    }
    before = headers.get(REPLAYS_HEADER)
    count = before if isinstance(before, int) and not isinstance(before, bool) else 0
    headers[REPLAYS_HEADER] = count + 1
    props.headers = headers
    props.delivery_mode = 2
    if props.user_id is not None and props.user_id != login:
        props.user_id = None
    return props


def copy_id_of(headers: dict[str, Any] | None) -> str | None:
    """The x-onceq-copy header when it is one the consumer would use as a stable ref."""
    value = (headers or {}).get(COPY_HEADER)
    return value if isinstance(value, str) and 0 < len(value) <= 64 else None


@dataclass
class DeadReport:
    """What a dead-letter command saw and did (`as_dict` is its --json)."""

    command: str  # list | replay | purge
    topology: Topology
    selection: Selection
    total: int = 0  # ready in the dead-letter queue when the command started
    seen: int = 0  # got (browsed) by the command
    matched: list[DeadLetter] = field(default_factory=list)
    done: list[DeadLetter] = field(default_factory=list)  # replayed / purged
    skipped: list[tuple[DeadLetter, str]] = field(default_factory=list)
    dry_run: bool = False
    op: int | None = None  # the ledger's dead_ops id
    seconds: float = 0.0
    declined: bool = False  # purge: the operator said no
    body: Any = None  # replay --body: the NewBody each copy carries (onceq._sources.amqp.dead_body)

    @property
    def missing(self) -> list[str]:
        """--id values that named no dead letter seen."""
        found = {letter.msg_id for letter in self.matched}
        return [i for i in self.selection.ids if i not in found]

    @property
    def left(self) -> int:
        return self.total - len(self.done)

    def as_dict(self) -> dict[str, Any]:
        t = self.topology
        out: dict[str, Any] = {
            "command": self.command,
            "queue": t.dead_letter_queue,
            "filter": self.selection.as_dict(),
            "total": self.total,
            "matched": len(self.matched),
        }
        if self.command == "list":
            out["letters"] = [letter.as_dict() for letter in self.matched]
            return out
        out.update(
            {
                "dry_run": self.dry_run,
                "done": len(self.done),
                "ids": [letter.msg_id for letter in (self.matched if self.dry_run else self.done)],
                "skipped": [{"message_id": s.msg_id, "why": why} for s, why in self.skipped],
                "missing": self.missing,
                "left": self.left,
                "op": self.op,
                "seconds": round(self.seconds, 3),
            }
        )
        if self.command == "replay":
            out["exchange"], out["routing_key"] = t.exchange, t.routing_key
            out["body"] = None if self.body is None else self.body.as_dict()
        else:
            out["declined"] = self.declined
        return out
