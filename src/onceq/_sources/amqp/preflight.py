"""Before a consumer takes anything: does the work queue dead-letter where onceq expects?

onceq settles a poison message with reject(requeue=False) and relies on the queue's
x-dead-letter-exchange / x-dead-letter-routing-key (as `onceq mq topology` declares
them) to move it to the dead-letter queue. A work queue declared without them (by
hand, by another tool) silently DROPS every message onceq gives up on, and `mq dead`
finds nothing. So `check_work_queue` refuses such a queue before consuming: one line
naming the queue, what is missing or different, and the command that declares it right
(Conflict, exit 4: the queue exists but with other attributes, as `mq topology` says
for the same situation; NotFound, exit 3, stays for a queue that does not exist).

How the arguments are read over AMQP: a passive declare does not return them, and the
management API is not always enabled. A non-passive declare of an EXISTING queue with
exactly its arguments is a no-op (a 200), and with other arguments a 406 whose text
names the first differing argument and its current value ("inequivalent arg
'x-dead-letter-exchange' ...: received the value 'eai.dlx' of type 'longstr' but current
is none"). `read_arguments` starts from the arguments `mq topology` would declare,
adopts each current value the broker names, on a throwaway channel per try (a 406 closes
it), until the declare is accepted: the result is what the broker holds, for every
argument it compares on redeclaration (dead-lettering, type, TTL, limits). Caveats,
each handled: the queue must exist (checked passively first; a queue deleted in the
instant between would be created with onceq's arguments, which is the fix anyway); a
user without `configure` permission gets 403 (one warning, the check is skipped, the
run goes on as before this check existed); an answer we cannot parse is reported
as it is.

The second check, `check_consumer_timeout`, only warns: the broker closes a channel that
holds a delivery unacked longer than its consumer_timeout (30 min by default; per queue
x-consumer-timeout from 3.12), and every delivery on it comes back. onceq holds one for
at most the flow's call timeout plus a commit and a settle (HOLD_MARGIN_S). Where the
limit is read: the queue's x-consumer-timeout when the argument probe above saw one,
else the broker's setting through `rabbitmqctl eval` when the broker is on this host
(AMQP does not carry it, and the management API does not show it either). When it
cannot be read: one debug line, nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
from dataclasses import dataclass, field
from typing import Any

from onceq._core.retry import DEFAULT_DELAYS, delay_label
from onceq._core.url_check import shown
from onceq._sources.amqp.topology import QUEUE, Queue, Topology, option_label
from onceq._sources.amqp.topology_types import DELIVERY_LIMIT, QUORUM
from onceq._sources.amqp.url import boundary, close_quietly, connect
from onceq.errors import Conflict

log = logging.getLogger("onceq.amqp.preflight")  # the name in every log line: kept across moves

DLX_KEYS = ("x-dead-letter-exchange", "x-dead-letter-routing-key")
# Each 406 teaches one argument; a queue has a handful. Past this, something else is
# wrong (a broker that answers differently): stop instead of looping.
MAX_TRIES = 24
# The broker's 406 text (stable since RabbitMQ 2.x, still so in 4.x).
INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<key>[^']+)' for queue '.*' in vhost '.*':"
    r" received (?P<got>.+?) but current is (?P<cur>.+?)\"?$",
    re.S,
)
VALUE = re.compile(r"the value '(?P<value>.*)' of type '(?P<type>\w+)'$", re.S)
INT_TYPES = {"byte", "short", "signedint", "long", "unsignedbyte", "unsignedshort", "unsignedint"}


@dataclass
class QueueFacts:
    """What the broker holds for a queue (the compared arguments), and its version."""

    arguments: dict[str, Any] = field(default_factory=dict)
    durable: bool = True
    broker_version: str = ""


def parse_inequivalent(
    text: str, sent: dict[str, Any] | None = None
) -> tuple[str, tuple[bool, Any]] | None:
    """(argument, (present, current value)) from a 406's text, or None if not ours.

    Two wordings: with a type ("the value 'quorum' of type 'longstr'") when one side
    is absent or the types differ, bare ("received 'a' but current is 'b'") when both
    have the same type: then the current value has the type of the one we `sent`.
    """
    m = INEQUIVALENT.search(text)
    if m is None:
        return None
    key, cur = m["key"], m["cur"].strip()
    if cur == "none":
        return key, (False, None)
    if key == "durable" and cur.strip("'") in ("true", "false"):
        return key, (True, cur.strip("'") == "true")
    bare = re.fullmatch(r"'(?P<value>.*)'", cur, re.S)
    if bare and not cur.startswith("'the value"):
        return key, (True, _like((sent or {}).get(key), bare["value"]))
    v = VALUE.match(cur)
    if v is None:
        return None
    value, kind = v["value"], v["type"]
    if kind in ("longstr", "shortstr"):
        return key, (True, value)
    if kind in INT_TYPES:
        return key, (True, int(value))
    if kind == "bool":
        return key, (True, value == "true")
    if kind in ("float", "double"):
        return key, (True, float(value))
    return None  # a table, an array, a timestamp: not one onceq reads


def _like(sent: Any, value: str) -> Any:
    """`value` (the broker's text) as the type of what we sent for the same argument."""
    if isinstance(sent, bool):
        return value == "true"
    if isinstance(sent, int):
        return int(value)
    if isinstance(sent, float):
        return float(value)
    return value


async def read_arguments(url: str, queue: str, guess: dict[str, Any]) -> QueueFacts | None:
    """The compared arguments the broker holds for an existing `queue`, or None when
    this user may not declare it (403: no configure permission). Conflict when the
    broker answers something this cannot read."""
    import aiormq.exceptions as ae

    facts = QueueFacts(arguments=dict(guess))
    connection = await connect(url)
    try:
        facts.broker_version = str((connection.server_properties or {}).get("version", ""))
        for _ in range(MAX_TRIES):
            channel = await connection.channel()
            try:
                await channel.queue_declare(
                    queue=queue, durable=facts.durable, arguments=facts.arguments
                )
            except ae.ChannelAccessRefused:
                return None
            except ae.ChannelPreconditionFailed as exc:
                text = str(exc)
                learned = parse_inequivalent(text, facts.arguments)
                if learned is None:
                    raise Conflict(f"queue {queue}: {_reason(text)}") from None
                key, (present, value) = learned
                if key == "durable":
                    facts.durable = bool(value)
                elif present:
                    facts.arguments[key] = value
                else:
                    facts.arguments.pop(key, None)
                continue
            await close_quietly(channel)
            return facts
        raise Conflict(f"queue {queue}: its arguments could not be read in {MAX_TRIES} declares")
    finally:
        await close_quietly(connection)


def _reason(text: str) -> str:
    """The broker's own words from an aiormq exception's text."""
    return text.rsplit("PRECONDITION_FAILED - ", 1)[-1].strip('"> ')


def fix_command(t: Topology) -> str:
    """The `onceq mq topology` command that declares `t` as onceq expects it."""
    how = "" if t.queue == QUEUE else f" --queue {t.queue}"
    # Each name the flow sets apart from the one its queue derives (or the claims one).
    derived = Topology.claims() if t.queue == QUEUE else Topology.for_queue(t.queue)
    for name in ("exchange", "routing_key", "dead_letter_exchange", "dead_letter_queue"):
        if getattr(t, name) != getattr(derived, name):
            how += f" {option_label(name)} {getattr(t, name)}"
    if t.retry_delays and t.retry_delays != DEFAULT_DELAYS:
        how += " --retry-delays " + ",".join(delay_label(d) for d in t.retry_delays)
    elif not t.retry_delays:
        how += " --retry-delays none"
    if t.queue_type == QUORUM:
        how += " --queue-type quorum"
    return f"onceq mq topology{how}"


def dead_letter_problem(t: Topology, held: dict[str, Any]) -> str:
    """Why the queue's dead-letter arguments are not the topology's, or ''."""
    wanted = {
        "x-dead-letter-exchange": t.dead_letter_exchange,
        "x-dead-letter-routing-key": t.dead_key,
    }
    for key in DLX_KEYS:
        if key not in held:
            return f"has no {key} (onceq expects {wanted[key]!r})"
        if held[key] != wanted[key]:
            return f"has {key} {held[key]!r}, onceq expects {wanted[key]!r}"
    return ""


async def check_work_queue(url: str, t: Topology) -> QueueFacts | None:
    """Refuse (Conflict, one line) a work queue without onceq's dead-letter arguments.

    Returns what was learned (None when this user may not read it: one warning).
    Also warns, once, about a quorum queue whose delivery limit would let the broker's
    counter decide before onceq's (docs/mq.md, Quorum queues).
    """
    # The Queue, not an Exchange of the same name: a queue without the ".in" suffix
    # ("orders") is its own stem, so its exchange is called "orders" too and comes first.
    work = next(o for o in t.objects()[0] if isinstance(o, Queue) and o.name == t.queue)
    guess = dict(work.arguments)
    with boundary(url, f"queue {t.queue}"):
        facts = await read_arguments(url, t.queue, guess)
    if facts is None:
        log.warning(
            "queue %s: its dead-letter arguments were not checked (this user may not"
            " declare it: no configure permission)",
            t.queue,
            extra={"event": "dead-letter-unchecked"},
        )
        return None
    why = dead_letter_problem(t, facts.arguments)
    if why:
        raise Conflict(
            f"queue {t.queue}: {why}, so a message onceq gives up on would be dropped, not"
            f" dead-lettered to {t.dead_letter_queue}; a queue's arguments cannot change:"
            f" move its messages, delete it, then run: {fix_command(t)}"
        )
    limit_warning = delivery_limit_problem(facts)
    if limit_warning:
        log.warning("queue %s: %s", t.queue, limit_warning, extra={"event": "delivery-limit"})
    return facts


def delivery_limit_problem(facts: QueueFacts) -> str:
    """A quorum queue whose broker-side limit would decide before onceq does, or ''."""
    args = facts.arguments
    if args.get("x-queue-type") != QUORUM:
        return ""
    limit = args.get("x-delivery-limit")
    major = facts.broker_version.split(".", 1)[0]
    if limit is None and major.isdigit() and int(major) >= 4:
        return (
            f"a quorum queue without x-delivery-limit: RabbitMQ {facts.broker_version}"
            " dead-letters a message after 20 returns (requeues, releases, lost channels),"
            f" before onceq's retry policy decides; declare it with x-delivery-limit"
            f" {DELIVERY_LIMIT} (onceq mq topology --queue-type quorum)"
        )
    if isinstance(limit, int) and limit < 0 and major.isdigit() and int(major) < 4:
        return (
            f"x-delivery-limit {limit} on RabbitMQ {facts.broker_version} dead-letters a"
            " message at its first return (unlimited only from 4.0)"
        )
    return ""


# Seconds a delivery may stay unacked beyond its call: the group commit (a PostgreSQL
# commit retried over a short outage), the settle, and the order turn of an ordered flow.
HOLD_MARGIN_S = 60.0
# rabbitmqctl starts an Erlang VM (~0.3 s); past this it is not answering.
CTL_TIMEOUT_S = 10.0
LOOPBACK = {"127.0.0.1", "::1", "localhost"}
CTL_QUERY = "application:get_env(rabbit, consumer_timeout)."


def consumer_timeout_problem(limit_ms: int | None, call_timeout: float, source: str) -> str:
    """The warning for a limit shorter than onceq needs, or '' (None: no limit)."""
    need_s = call_timeout + HOLD_MARGIN_S
    if limit_ms is None or limit_ms >= need_s * 1000:
        return ""
    return (
        f"{source} is {limit_ms / 1000:g}s, shorter than a delivery may be held"
        f" ({call_timeout:g}s call timeout + {HOLD_MARGIN_S:g}s for commit and settle):"
        " the broker would close the channel under a slow call and redeliver its messages;"
        " raise consumer_timeout (rabbitmq.conf) or lower the flow's timeout"
    )


def parse_ctl(out: str) -> tuple[bool, int | None]:
    """(understood, limit ms) from `rabbitmqctl eval` of CTL_QUERY; None = no limit."""
    text = out.strip()
    m = re.fullmatch(r"\{ok,\s*(\d+)\}", text)
    if m:
        return True, int(m[1])
    if text in ("undefined", "{ok,false}", "{ok,infinity}"):
        return True, None
    return False, None


async def broker_consumer_timeout(url: str) -> tuple[bool, int | None]:
    """The broker's consumer_timeout via rabbitmqctl, when the broker is on this host."""
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").lower()
    ctl = shutil.which("rabbitmqctl")
    if host not in LOOPBACK or ctl is None:
        log.debug(
            "consumer_timeout of %s: not read (not on this host, or no rabbitmqctl)",
            shown(url),
            extra={"event": "consumer-timeout-unread"},
        )
        return False, None
    proc = await asyncio.create_subprocess_exec(
        ctl,
        "-q",
        "eval",
        CTL_QUERY,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), CTL_TIMEOUT_S)
    except BaseException:
        # Timed out, or the run stopped first: never leave an Erlang VM behind.
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    understood, limit = (
        parse_ctl(out.decode("utf-8", "replace")) if proc.returncode == 0 else (False, None)
    )
    if not understood:
        log.debug(
            "consumer_timeout of %s: rabbitmqctl did not tell (exit %s)",
            shown(url),
            proc.returncode,
            extra={"event": "consumer-timeout-unread"},
        )
    return understood, limit


# How long a run has lasted before the broker's consumer_timeout is read through
# rabbitmqctl. Why wait: rabbitmqctl is an Erlang VM, ~0.5 s of a core, and a run that is
# over sooner (a drain with --until-empty, a test, a benchmark) never holds a delivery
# long enough for a consumer_timeout to matter (the broker checks it once a minute).
CTL_AFTER_S = 10.0


async def check_consumer_timeout(
    url: str,
    queue: str,
    call_timeout: float | None,
    facts: QueueFacts | None,
    *,
    ctl_after: float = 0.0,
) -> str:
    """Log (and return) a warning when the broker would cut a delivery onceq still holds.

    The queue's own x-consumer-timeout is compared at once; the broker's setting is read
    through rabbitmqctl only after `ctl_after` seconds (the consumer passes CTL_AFTER_S)."""
    if call_timeout is None:
        log.debug(
            "consumer_timeout: the flow's call has no timeout of its own; not compared",
            extra={"event": "consumer-timeout-unread"},
        )
        return ""
    per_queue = (facts.arguments if facts else {}).get("x-consumer-timeout")
    if isinstance(per_queue, int):
        problem = consumer_timeout_problem(
            per_queue, call_timeout, f"queue {queue}'s x-consumer-timeout"
        )
    else:
        await asyncio.sleep(ctl_after)
        try:
            understood, limit = await broker_consumer_timeout(url)
        except (OSError, TimeoutError) as exc:
            log.debug(
                "consumer_timeout of %s: not read (%s)",
                shown(url),
                type(exc).__name__,
                extra={"event": "consumer-timeout-unread"},
            )
            return ""
        if not understood:
            return ""
        problem = consumer_timeout_problem(limit, call_timeout, "the broker's consumer_timeout")
    if problem:
        log.warning("queue %s: %s", queue, problem, extra={"event": "consumer-timeout"})
    return problem
