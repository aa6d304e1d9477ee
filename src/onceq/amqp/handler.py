"""A claim delivery: its id (decode) and its effect, a POST to the claim system.

The HTTP outcome becomes a `Kind`; the loop turns it into ack / requeue / dead
with `onceq.transport.decide`, so the settle table lives in one place:

| claim system says                   | Kind      | reason                  |
| 201                                 | SUCCESS   |                         |
| 422 (business rejection)            | REJECTED  | http-422                |
| 503, any other status               | TRANSIENT | http-503, http-<status> |
| connection refused / reset          | TRANSIENT | connect-error           |
| no answer within the timeout        | TRANSIENT | timeout                 |

Only 201 counts as done: a 200 or a 3xx may mean the claim was not created, and
retrying once then dead-lettering loses nothing (the dead letter keeps the body).
aiohttp exceptions are turned into Outcomes here and nowhere else.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from onceq.consumer import Outcome
from onceq.errors import redact_text
from onceq.ledger_values import fits_int64, is_utf8
from onceq.transport import Delivery, Kind

CLAIMS_PATH = "/v1/claims"
DETAIL_MAX = 200  # keep failure rows short: the body of an error page is not evidence


def decode(delivery: Delivery) -> Outcome:
    """Set delivery.msg_id from the message_id property (else the body's guid).

    A body that is not a JSON object can never be accepted, so it is rejected here
    (dead-lettered at once) rather than sent to the claim system and retried. So is
    a body whose id or kept fields the ledger or an HTTP header cannot carry: any
    such failure found later would be the whole group's (a crash at the commit, a
    redelivery to every consumer), never this one message's.

    | reason     | the message …                                                  |
    | parse      | is not UTF-8 JSON (incl. an integer of > 4300 digits, deep nesting) |
    | not-object | is JSON, but not an object                                     |
    | missing-id | has no usable message_id property and no guid                  |
    | bad-id     | its guid is not a string or an integer, or an id holds a control character |
    | encoding   | its id or claimId holds a lone surrogate (legal as a JSON escape only) |
    """
    try:
        doc = json.loads(delivery.body.decode("utf-8-sig"))
    except (ValueError, RecursionError) as exc:
        # ValueError covers UnicodeDecodeError, JSONDecodeError and the plain ValueError
        # of an integer over Python's 4300-digit conversion limit.
        return Outcome(Kind.REJECTED, "parse", _short(f"{type(exc).__name__}: {exc}"))
    if not isinstance(doc, dict):
        return Outcome(Kind.REJECTED, "not-object", f"top level is {type(doc).__name__}")
    prop = delivery.headers.get("message_id")
    if isinstance(prop, str) and prop.strip():
        msg_id = prop
    else:  # missing, empty or blank: a publisher that set none; the body's guid decides
        guid = doc.get("guid")
        if guid is None or (isinstance(guid, str) and not guid.strip()):
            return Outcome(Kind.REJECTED, "missing-id", "no message_id property and no guid")
        if isinstance(guid, bool) or not isinstance(guid, str | int):
            return Outcome(Kind.REJECTED, "bad-id", f"guid is a {type(guid).__name__}")
        msg_id = str(guid)
    if not is_utf8(msg_id):
        return Outcome(Kind.REJECTED, "encoding", "the id is not UTF-8 text (a lone surrogate)")
    if CONTROL_CHARS.search(msg_id):
        # It becomes the Idempotency-Key header, which cannot carry CR, LF or NUL.
        return Outcome(Kind.REJECTED, "bad-id", "the id holds a control character")
    amount = doc.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, int | float):
        amount = None  # recorded for reports only; a claim without one is still a claim
    elif isinstance(amount, int) and not fits_int64(amount):
        amount = None  # SQLite's INTEGER would refuse it at the commit (OverflowError)
    elif isinstance(amount, float) and not math.isfinite(amount):
        amount = None  # 1e999 parses as inf; NaN would be stored as NULL anyway
    claim_id = doc.get("claimId")
    order_no = None if claim_id is None else str(claim_id)
    if order_no is not None and not is_utf8(order_no):
        return Outcome(Kind.REJECTED, "encoding", "claimId holds a lone surrogate")
    delivery.msg_id = msg_id
    # The ledger's contract (issue 7): group, seq, kept (stored as JSON), doc (never stored).
    fields = {
        "group": order_no,
        "seq": None,
        "kept": {} if amount is None else {"amount": amount},
        "doc": doc,
    }
    return Outcome(Kind.SUCCESS, fields=fields)


# C0 controls and DEL: not allowed in an HTTP header value (aiohttp refuses CR/LF).
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def check_claim_url(url: str) -> str:
    """The claim system's base URL, without a trailing slash; UsageError if unusable."""
    from onceq.amqp.url import check_url

    return check_url(url, "--claim ", ("http", "https"), "a claim system's port").rstrip("/")


class ClaimHandler:
    """POSTs each delivery's body to CLAIM/v1/claims with Idempotency-Key = message_id.

    aiohttp, not httpx: measured on the consumer's hot path (bench/mq_end_to_end.py),
    httpx.AsyncClient spent ~800 us of CPU per call against ~150 us for aiohttp, and
    the consumer is CPU-bound when the claim system is fast. The pool holds
    `concurrency` connections so prefetch deliveries really run at once; the
    timeouts are explicit so a stalled claim system costs one bounded wait per
    message (then the transient path) instead of a hung consumer.
    """

    def __init__(self, claim_url: str, *, concurrency: int, timeout: float) -> None:
        import aiohttp

        self.url = check_claim_url(claim_url) + CLAIMS_PATH
        self._aiohttp = aiohttp
        self._limit = max(concurrency, 1)
        self._timeout = aiohttp.ClientTimeout(total=timeout, connect=min(timeout, 5.0))
        self._session: Any = None  # made on first use: aiohttp binds it to the running loop

    def _client(self) -> Any:
        if self._session is None:
            aiohttp = self._aiohttp
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._limit),
                timeout=self._timeout,
                # A proxy from the environment would send claims somewhere else.
                trust_env=False,
            )
        return self._session

    async def __call__(self, delivery: Delivery, fields: dict[str, Any]) -> Outcome:
        aiohttp = self._aiohttp
        assert delivery.msg_id is not None
        try:
            async with self._client().post(
                self.url,
                data=delivery.body,
                headers={"Content-Type": "application/json", "Idempotency-Key": delivery.msg_id},
            ) as resp:
                status = resp.status
                text = "" if status == 201 else await resp.text(errors="replace")
        except TimeoutError as exc:  # aiohttp's ServerTimeoutError is a TimeoutError too
            return Outcome(Kind.TRANSIENT, "timeout", type(exc).__name__)
        except aiohttp.ClientConnectionError as exc:  # refused, reset, server disconnected
            return Outcome(Kind.TRANSIENT, "connect-error", _short(exc))
        except aiohttp.ClientError as exc:
            return Outcome(Kind.TRANSIENT, "http-error", _short(exc))
        if status == 201:
            return Outcome(Kind.SUCCESS, fields=fields)
        detail = _short(text)
        if status == 422:
            return Outcome(Kind.REJECTED, "http-422", detail)
        return Outcome(Kind.TRANSIENT, f"http-{status}", detail)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def _short(value: object) -> str:
    text = " ".join(str(value).split())
    if not text and isinstance(value, BaseException):
        text = type(value).__name__
    return redact_text(text[:DETAIL_MAX])
