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
from typing import Any

from onceq.consumer import Outcome
from onceq.errors import redact_text
from onceq.transport import Delivery, Kind

CLAIMS_PATH = "/v1/claims"
DETAIL_MAX = 200  # keep failure rows short: the body of an error page is not evidence


def decode(delivery: Delivery) -> Outcome:
    """Set delivery.msg_id from the message_id property (else the body's guid).

    A body that is not a JSON object can never be accepted, so it is rejected here
    (dead-lettered at once) rather than sent to the claim system and retried.
    """
    try:
        doc = json.loads(delivery.body.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        return Outcome(Kind.REJECTED, "parse", type(exc).__name__)
    if not isinstance(doc, dict):
        return Outcome(Kind.REJECTED, "not-object", f"top level is {type(doc).__name__}")
    msg_id = delivery.headers.get("message_id") or doc.get("guid")
    if msg_id is None or not str(msg_id).strip():
        return Outcome(Kind.REJECTED, "missing-id", "no message_id property and no guid")
    delivery.msg_id = str(msg_id)
    amount = doc.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, int | float):
        amount = None  # recorded for reports only; a claim without one is still a claim
    claim_id = doc.get("claimId")
    fields = {"order_no": None if claim_id is None else str(claim_id), "amount": amount}
    return Outcome(Kind.SUCCESS, fields=fields)


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
