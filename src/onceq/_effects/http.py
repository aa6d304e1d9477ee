"""The HTTP effect: one request per message, the partner's status becomes a `Kind`.

The loop turns the Kind into ack / requeue / delay / dead with the flow's retry
policy (`onceq._core.retry.RetryPolicy.decide`), so the settle table lives in one place.
By default (`StatusMap()`):

| partner says                        | Kind                         | reason           |
| 2xx                                 | SUCCESS                      |                  |
| 409 ("already have it")             | SUCCESS, partner_duplicate   |                  |
| other 4xx                           | REJECTED (dead at once)      | http-<status>    |
| 5xx, 408, 425, 429, anything else   | TRANSIENT (the retry rule)   | http-<status>    |
| connection refused / reset          | TRANSIENT                    | connect-error    |
| no answer within the timeout        | TRANSIENT                    | timeout          |
| aiohttp refuses to build the request | REJECTED (dead at once)     | config-error     |

The last row is the flow's configuration (aiohttp's ValueError/TypeError, the same for
every message), not the message's: what onceq._effects.http_headers did not refuse up front.

A transient answer with a `Retry-After` header (delta-seconds or an HTTP date) sets
`Outcome.retry_after` (`retry_after_seconds`: at most a day; a past date, a negative
number or garbage is ignored), and the retry policy then waits at least that long.

aiohttp exceptions become Outcomes here and nowhere else. aiohttp, not httpx:
measured on the consumer's hot path (bench/mq_end_to_end.py), httpx.AsyncClient
spent ~800 us of CPU per call against ~150 us for aiohttp, and the consumer is
CPU-bound when the partner is fast. So the per-call work is kept minimal: one
session, headers built once, the status looked up in a table of 600 entries.

Header values are secrets (a bearer token): they are never shown in a detail, a
repr or a log line (a config-error's one line is masked by onceq._core.effect), and a
failure's detail has every header value replaced by *** before it is cut, whatever a
library echoed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote, urlsplit

from onceq._core.effect import DETAIL_MAX, effect_raised
from onceq._core.fields import ABSENT, PATH_TEXT, get_path, split_path
from onceq._core.outcome import Outcome
from onceq._core.redact import MIN_REMEMBERED, secret_shapes
from onceq._core.retry import RETRY_AFTER_CAP
from onceq._core.transport import Delivery, Kind
from onceq._core.url_check import check_url, shown
from onceq._core.values import CONTROL_CHARS
from onceq._effects.http_headers import request_headers
from onceq.errors import UsageError, redact_text

SUCCESS, DUPLICATE, REJECT, TRANSIENT = "success", "duplicate", "reject", "transient"
# Kind.SUCCESS as a global: read per call (onceq._core.transport, above ACK).
_SUCCEEDED = Kind.SUCCESS
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")

StatusList = Iterable[int | str]

_DELTA_SECONDS = re.compile(r"\d+(?:\.\d+)?")


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """A Retry-After header's wait in seconds (RFC 9110 §10.2.3), None when it says none.

    `120` (delta-seconds; a decimal too, as some servers send) or an HTTP date
    (`Wed, 21 Oct 2026 07:28:00 GMT`, relative to `now`). Capped at RETRY_AFTER_CAP.
    A date in the past, 0, a negative number and anything unparsable are None: the
    header is the partner's hint, and a malformed hint must not fail the message.
    """
    if value is None:
        return None
    text = value.strip()
    if _DELTA_SECONDS.fullmatch(text):
        # More digits than any sane wait: the cap, without converting a 10^6-digit int.
        seconds = float(text) if len(text) <= 15 else RETRY_AFTER_CAP
    else:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when is None:
            return None
        if when.tzinfo is None:  # "-0000": UTC by RFC 5322
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if not seconds > 0:
        return None
    return min(seconds, RETRY_AFTER_CAP)


def _parse_item(item: int | str, role: str) -> int | str:
    """An exact status (int 100-599) or a class ("2xx"), else UsageError naming it."""
    text = str(item).strip().lower()
    if isinstance(item, bool):
        raise UsageError(f"{role}: {item!r} is not an HTTP status (100-599 or 1xx-5xx)")
    if re.fullmatch(r"[1-5]xx", text):
        return text
    if re.fullmatch(r"\d{3}", text) and 100 <= int(text) <= 599:
        return int(text)
    raise UsageError(f"{role}: {str(item)!r} is not an HTTP status (100-599 or 1xx-5xx)")


@dataclass(frozen=True)
class StatusMap:
    """Which statuses mean success, duplicate, reject, transient.

    Entries are exact codes (100-599) or classes ("4xx"); an exact code wins over a
    class, so the default reject "4xx" leaves 408/425/429 transient. The same exact
    code (or class) in two lists is an error. A status in no list is transient: a
    retry then a dead letter loses nothing (the dead letter keeps the body).
    """

    success: tuple[int | str, ...] = ("2xx",)
    duplicate: tuple[int | str, ...] = (409,)
    reject: tuple[int | str, ...] = ("4xx",)
    transient: tuple[int | str, ...] = ("5xx", 408, 425, 429)
    # The role of each status 0-599, built by __post_init__ (not an argument, not compared).
    _table: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        seen: dict[int | str, str] = {}
        for role in (SUCCESS, DUPLICATE, REJECT, TRANSIENT):
            items = getattr(self, role)
            if isinstance(items, str | int):
                items = (items,)
            parsed = tuple(_parse_item(i, role) for i in items)
            for item in parsed:
                other = seen.setdefault(item, role)
                if other != role:
                    raise UsageError(f"{role}: {item} is also in {other}")
            object.__setattr__(self, role, parsed)
        if not self.success:
            # No status would count as done: every message would be retried, then dead.
            raise UsageError("success: an empty list (no status would mean done)")
        table = [TRANSIENT] * 600
        for exact in (False, True):  # classes first, exact codes over them
            for item, role in seen.items():
                if isinstance(item, int) and exact:
                    table[item] = role
                elif isinstance(item, str) and not exact:
                    base = int(item[0]) * 100
                    table[base : base + 100] = [role] * 100
        object.__setattr__(self, "_table", tuple(table))

    @classmethod
    def parse(
        cls,
        success: str | StatusList | None = None,
        duplicate: str | StatusList | None = None,
        reject: str | StatusList | None = None,
        transient: str | StatusList | None = None,
    ) -> StatusMap:
        """A map from lists or comma-separated text ("2xx,409"); None keeps a default.

        An empty text or list means "none" (e.g. `duplicate=""`: no status is a
        duplicate). UsageError names the list and the item that is wrong.
        """
        given = {SUCCESS: success, DUPLICATE: duplicate, REJECT: reject, TRANSIENT: transient}
        out: dict[str, tuple[int | str, ...]] = {}
        for role, value in given.items():
            if value is None:
                continue
            if isinstance(value, str):
                value = [p for p in (s.strip() for s in value.split(",")) if p]
            elif isinstance(value, int):
                value = [value]
            out[role] = tuple(value)
        return cls(**out)

    def role(self, status: int) -> str:
        """success | duplicate | reject | transient for one status code."""
        if 0 <= status < 600:
            return self._table[status]
        return TRANSIENT


class HttpEffect:
    """Sends each message's bytes to a partner; its status decides the outcome.

    `url` may hold `{path}` placeholders filled from the message (URL-encoded; a
    message without that field is rejected `missing-field`). The body is the message
    unchanged, `Content-Type: application/json`, and `idempotency_header` carries the
    message id (None: no such header), so a partner that deduplicates sees a repeat.
    The pool holds `concurrency` connections so that many deliveries really run at
    once; the timeouts are explicit so that a stalled partner costs one bounded wait
    per message (then the transient path) instead of a hung consumer.
    """

    def __init__(
        self,
        url: str,
        *,
        method: str = "POST",
        headers: Mapping[str, str] | None = None,
        idempotency_header: str | None = "Idempotency-Key",
        statuses: StatusMap | None = None,
        timeout: float = 10.0,
        concurrency: int = 5,
    ) -> None:
        self.url = url
        self.method = str(method).upper()
        if not re.fullmatch(r"[A-Z]+", self.method):
            raise UsageError(f"method: {method!r} is not an HTTP method")
        names = _PLACEHOLDER.findall(url)
        try:
            self._fields = [(n, split_path(n, "URL placeholder")) for n in names]
        except UsageError:
            bad = next(n for n in names if not PATH_TEXT.fullmatch(n))
            raise UsageError(f"url {shown(url)}: {{{bad}}} is not a field (a.b.c)") from None
        # Checked with each placeholder as a plain letter; a placeholder in the host or
        # port is refused: it would be a partner that only some messages can reach.
        check_url(_PLACEHOLDER.sub("x", url), "url ", ("http", "https"), "a partner's port")
        if names and "{" in urlsplit(url).netloc:
            raise UsageError(f"url {shown(url)}: a {{field}} may stand in the path or query only")
        self._parts = _PLACEHOLDER.split(url)  # literal, name, literal, name, ... literal
        if any(c in part for part in self._parts[::2] for c in "{}"):
            # `/api/{invoiceId` (a typo): sent as it is, every call would miss the
            # partner's route and dead-letter the queue; a literal brace is %7B/%7D.
            raise UsageError(f"url {shown(url)}: a '{{' or '}}' that is not a {{field}}")
        # inf passed here and failed each call (aiohttp: OverflowError), so every
        # message was quarantined as internal-error; nan is never > 0.
        if not isinstance(timeout, int | float) or not 0 < timeout < math.inf:
            raise UsageError(f"timeout: {timeout!r} is not a positive number of seconds")
        self.timeout = float(timeout)
        self.concurrency = max(int(concurrency), 1)
        self.statuses = statuses if statuses is not None else StatusMap()
        # Every header mistake aiohttp would raise on (or send wrong) with each message,
        # refused now, before anything is consumed (onceq._effects.http_headers).
        base = request_headers(url, headers, idempotency_header)
        self.idempotency_header = idempotency_header
        given = {v for v in (headers or {}).values() if v}
        # Each value as given, and in every shape a partner may echo it (JSON-escaped,
        # percent-encoded, the token of `Bearer T` alone) when long enough to be told
        # from ordinary text.
        shapes = given | {s for v in given for s in secret_shapes(v) if len(s) >= MIN_REMEMBERED}
        self._secrets = tuple(sorted(shapes, key=len, reverse=True))  # longest first
        self._headers = base
        self._session: Any = None  # made on first use: aiohttp binds it to the running loop
        self._static: Any = None  # the parsed URL when it has no placeholder

    def __repr__(self) -> str:
        # Header names only: their values may be credentials.
        names = [n for n in self._headers if n != "Content-Type"]
        return (
            f"HttpEffect({self.method} {redact_text(self.url)}, headers={names}, "
            f"idempotency_header={self.idempotency_header!r}, statuses={self.statuses!r}, "
            f"timeout={self.timeout}, concurrency={self.concurrency})"
        )

    def _client(self) -> Any:
        if self._session is None:
            import aiohttp

            self._aiohttp = aiohttp
            if not self._fields:
                # One parsed URL for every call: yarl parses and requotes a str each time.
                from yarl import URL

                self._static = URL(self.url)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.concurrency),
                timeout=aiohttp.ClientTimeout(total=self.timeout, connect=min(self.timeout, 5.0)),
                # A proxy from the environment would send the messages somewhere else.
                trust_env=False,
            )
        return self._session

    def target(self, fields: Mapping[str, Any]) -> str | Outcome:
        """The URL for one message, or its rejection when a placeholder's field is missing."""
        if not self._fields:
            return self.url
        doc = fields.get("doc") or {}
        parts = list(self._parts)
        for i, (name, path) in enumerate(self._fields):
            value = get_path(doc, path)
            if value is None or value is ABSENT:
                return Outcome(Kind.REJECTED, "missing-field", name)
            try:
                parts[2 * i + 1] = quote(str(value), safe="")
            except UnicodeEncodeError:  # "\ud800" is legal JSON, not UTF-8: no URL holds it
                return Outcome(Kind.REJECTED, "encoding", f"{name} holds a lone surrogate")
        return "".join(parts)

    async def __call__(self, delivery: Delivery, fields: dict[str, Any]) -> Outcome:
        url: Any = None
        if self._fields:
            url = self.target(fields)
            if isinstance(url, Outcome):
                return url
        headers = self._headers
        key = delivery.msg_id
        if self.idempotency_header is not None and key is not None:
            if CONTROL_CHARS.search(key):
                # A spec that allows it (the orders preset) can hand one over; aiohttp would
                # raise a ValueError on every try. The same bytes fail every time: dead.
                return Outcome(Kind.REJECTED, "bad-id", "the id holds a control character")
            headers = {**headers, self.idempotency_header: key}
        session = self._client()
        aiohttp = self._aiohttp
        if url is None:
            url = self._static
        try:
            async with session.request(
                self.method, url, data=delivery.body, headers=headers
            ) as resp:
                status = resp.status
                role = self.statuses.role(status)
                text = "" if role in (SUCCESS, DUPLICATE) else await resp.text(errors="replace")
                # Only a transient answer's: a rejection is dead whatever it asks.
                after = (
                    retry_after_seconds(resp.headers.get("Retry-After"))
                    if role == TRANSIENT
                    else None
                )
        except TimeoutError as exc:  # aiohttp's ServerTimeoutError is a TimeoutError too
            return Outcome(Kind.TRANSIENT, "timeout", type(exc).__name__)
        except aiohttp.ClientConnectionError as exc:  # refused, reset, server disconnected
            return Outcome(Kind.TRANSIENT, "connect-error", self._short(exc))
        except (ValueError, TypeError) as exc:
            # aiohttp refused to build the request from the flow's own configuration
            # (InvalidURL is a ValueError too): the same for every message, so dead at once
            # (config-error), not retried. http_headers refuses what it knows up front.
            return effect_raised(delivery, exc, config=True, mask=self._short)
        except aiohttp.ClientError as exc:
            return Outcome(Kind.TRANSIENT, "http-error", self._short(exc))
        if role == SUCCESS:
            return Outcome(_SUCCEEDED, fields=fields)
        if role == DUPLICATE:
            return Outcome(_SUCCEEDED, fields={**fields, "partner_duplicate": True})
        if role == REJECT:
            return Outcome(Kind.REJECTED, f"http-{status}", self._short(text))
        return Outcome(Kind.TRANSIENT, f"http-{status}", self._short(text), retry_after=after)

    def _short(self, value: object) -> str:
        """A detail for the ledger: one line, 200 chars, no header value, no password."""
        text = " ".join(str(value).split())
        if not text and isinstance(value, BaseException):
            text = type(value).__name__
        for secret in self._secrets:  # before cutting: a cut secret would not match
            text = text.replace(secret, "***")
        return redact_text(text[:DETAIL_MAX])

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
