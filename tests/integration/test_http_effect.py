"""HttpEffect against real servers: `onceq partner invoices` as a process, and a tiny
aiohttp server in the test for what that stub does not answer (408/425/429, a slow
answer, the raw path, the headers it was sent).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from mq_support import partner
from onceq._core.message import MessageSpec
from onceq._core.transport import Delivery, Kind
from onceq._effects.http import HttpEffect, StatusMap
from onceq._exercise.presets import CLAIMS, claims_http
from support import free_port

INVOICE = MessageSpec(id_field="invoiceId")
SECRET = "tok-SeCrEt-42"


def _call(effect: HttpEffect, doc: dict[str, Any], spec: MessageSpec = INVOICE) -> Any:
    """Decode doc with spec, then one call of the effect (its session closed after)."""

    async def main() -> Any:
        try:
            return await _acall(effect, doc, spec)
        finally:
            await effect.aclose()

    return asyncio.run(main())


async def _acall(effect: HttpEffect, doc: dict[str, Any], spec: MessageSpec = INVOICE) -> Any:
    d = Delivery(body=json.dumps(doc).encode(), ref="r", headers={})
    decoded = spec.decode(d)
    assert decoded.kind is Kind.SUCCESS, decoded
    return await effect(d, decoded.fields)


# --- the invoice partner (a real process) ---------------------------------------------


def test_the_invoice_partner_201_409_422_503() -> None:
    with partner(kind="invoices") as p:
        url = f"{p.url}/api/invoices"

        async def main() -> list[Any]:
            effect = HttpEffect(url)
            try:
                good = {"invoiceId": "INV-1", "customer": "ACME", "total": 120.5}
                return [
                    await _acall(effect, good),
                    await _acall(effect, good),  # the partner already has it
                    await _acall(effect, {**good, "invoiceId": "INV-2", "total": -1}),
                    await _acall(effect, {**good, "invoiceId": "INV-3", "customer": "BUSY co"}),
                ]
            finally:
                await effect.aclose()

        created, again, refused, busy = asyncio.run(main())
        stats = p.stats()
    assert created.kind is Kind.SUCCESS and "partner_duplicate" not in created.fields
    assert created.fields["doc"]["invoiceId"] == "INV-1"
    assert again.kind is Kind.SUCCESS and again.fields["partner_duplicate"] is True
    assert (refused.kind, refused.reason) == (Kind.REJECTED, "http-422")
    assert "total missing, not a number, or negative" in refused.detail
    assert (busy.kind, busy.reason) == (Kind.TRANSIENT, "http-503")
    # every call carried Idempotency-Key == invoiceId (checked by partner() on exit too)
    assert stats["by_key"] == {"INV-1": 2, "INV-2": 1, "INV-3": 1}


def test_a_partner_that_does_not_listen_is_a_connect_error() -> None:
    effect = HttpEffect(f"http://127.0.0.1:{free_port()}/api/invoices", timeout=2)
    out = _call(effect, {"invoiceId": "INV-1"})
    assert (out.kind, out.reason) == (Kind.TRANSIENT, "connect-error")


# --- a tiny server of the test's own --------------------------------------------------


class Seen:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.peak = 0


@asynccontextmanager
async def server(delay: float = 0.0) -> AsyncIterator[tuple[str, Seen]]:
    """/status/{code} answers that code (its body echoes the request's headers);
    /slow sleeps `delay`; every request is recorded (method, raw path, headers, body)."""
    seen = Seen()

    async def handle(request: web.Request) -> web.Response:
        seen.in_flight += 1
        seen.peak = max(seen.peak, seen.in_flight)
        try:
            seen.requests.append(
                {
                    "method": request.method,
                    "raw_path": request.raw_path,
                    "headers": dict(request.headers),
                    "body": await request.read(),
                }
            )
            if request.path.startswith("/slow"):
                await asyncio.sleep(delay)
            code = int(request.match_info.get("code", "201"))
            # A careless partner echoing the headers it got: a secret a detail must hide.
            return web.Response(status=code, text=json.dumps(dict(request.headers)))
        finally:
            seen.in_flight -= 1

    app = web.Application()
    app.router.add_route("*", "/status/{code}", handle)
    app.router.add_route("*", "/slow", handle)
    app.router.add_route("*", "/raw/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


def _with_server(body: Callable[[str, Seen], Any], delay: float = 0.0) -> tuple[Any, Seen]:
    async def main() -> tuple[Any, Seen]:
        async with server(delay) as (base, seen):
            return await body(base, seen), seen

    return asyncio.run(main())


@pytest.mark.parametrize(
    ("code", "kind", "reason"),
    [
        (200, Kind.SUCCESS, ""),
        (204, Kind.SUCCESS, ""),
        (400, Kind.REJECTED, "http-400"),
        (404, Kind.REJECTED, "http-404"),
        (408, Kind.TRANSIENT, "http-408"),
        (425, Kind.TRANSIENT, "http-425"),
        (429, Kind.TRANSIENT, "http-429"),
        (500, Kind.TRANSIENT, "http-500"),
        (302, Kind.TRANSIENT, "http-302"),
    ],
)
def test_each_status_by_the_default_map(code: int, kind: Kind, reason: str) -> None:
    async def body(base: str, seen: Seen) -> Any:
        effect = HttpEffect(f"{base}/status/{code}")
        try:
            return await _acall(effect, {"invoiceId": "INV-1"})
        finally:
            await effect.aclose()

    out, _ = _with_server(body)
    assert (out.kind, out.reason) == (kind, reason)


def test_a_configured_map_turns_200_into_a_transient_and_410_into_a_duplicate() -> None:
    async def body(base: str, seen: Seen) -> Any:
        effect = HttpEffect(
            f"{base}/status/{{code}}",
            statuses=StatusMap.parse(success="201", duplicate="410"),
        )
        try:
            return [await _acall(effect, {"invoiceId": "I", "code": c}) for c in (200, 410)]
        finally:
            await effect.aclose()

    (ok, dup), _ = _with_server(body)
    assert (ok.kind, ok.reason) == (Kind.TRANSIENT, "http-200")
    assert dup.kind is Kind.SUCCESS and dup.fields["partner_duplicate"] is True


def test_a_slow_partner_is_a_timeout() -> None:
    async def body(base: str, seen: Seen) -> Any:
        effect = HttpEffect(f"{base}/slow", timeout=0.3)
        try:
            return await _acall(effect, {"invoiceId": "INV-1"})
        finally:
            await effect.aclose()

    out, _ = _with_server(body, delay=2.0)
    assert (out.kind, out.reason) == (Kind.TRANSIENT, "timeout")


def test_a_placeholder_arrives_percent_encoded_in_the_raw_path() -> None:
    async def body(base: str, seen: Seen) -> Any:
        effect = HttpEffect(f"{base}/raw/{{invoiceId}}/lines?c={{customer.name}}")
        try:
            doc = {"invoiceId": "INV 1/ä?#", "customer": {"name": "A&B=C"}}
            return await _acall(effect, doc)
        finally:
            await effect.aclose()

    out, seen = _with_server(body)
    assert out.kind is Kind.SUCCESS, out
    assert seen.requests[0]["raw_path"] == "/raw/INV%201%2F%C3%A4%3F%23/lines?c=A%26B%3DC"


def test_method_body_idempotency_header_and_extra_headers_are_sent() -> None:
    doc = {"invoiceId": "INV-9", "customer": "ACME", "total": 1}

    async def body(base: str, seen: Seen) -> Any:
        effect = HttpEffect(
            f"{base}/status/201",
            method="put",
            headers={"Authorization": f"Bearer {SECRET}", "X-Tenant": "t1"},
            idempotency_header="X-Request-Key",
        )
        try:
            return await _acall(effect, doc)
        finally:
            await effect.aclose()

    out, seen = _with_server(body)
    assert out.kind is Kind.SUCCESS
    req = seen.requests[0]
    assert req["method"] == "PUT" and req["body"] == json.dumps(doc).encode()
    h = req["headers"]
    assert h["X-Request-Key"] == "INV-9" and "Idempotency-Key" not in h
    assert h["Authorization"] == f"Bearer {SECRET}" and h["X-Tenant"] == "t1"
    assert h["Content-Type"] == "application/json"


def test_no_idempotency_header_when_told_none() -> None:
    async def body(base: str, seen: Seen) -> Any:
        effect = HttpEffect(f"{base}/status/201", idempotency_header=None)
        try:
            return await _acall(effect, {"invoiceId": "I"})
        finally:
            await effect.aclose()

    _, seen = _with_server(body)
    assert "Idempotency-Key" not in seen.requests[0]["headers"]


def test_a_header_value_never_shows_in_a_detail_a_repr_or_a_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    headers = {"Authorization": f"Bearer {SECRET}", "X-Api-Key": SECRET}

    async def body(base: str, seen: Seen) -> Any:
        outs = []
        for url in (f"{base}/status/500", f"{base}/status/422", f"{base}/slow"):
            effect = HttpEffect(url, headers=headers, timeout=0.3)
            try:
                outs.append(await _acall(effect, {"invoiceId": "I"}))
            finally:
                await effect.aclose()
            outs.append(repr(effect))
        refused = HttpEffect(f"http://127.0.0.1:{free_port()}/x", headers=headers)
        outs.append(await _acall(refused, {"invoiceId": "I"}))
        await refused.aclose()
        return outs

    outs, seen = _with_server(body, delay=2.0)
    # the server did get the secret, and echoed it in its answers
    assert seen.requests[0]["headers"]["Authorization"] == f"Bearer {SECRET}"
    reasons = [o.reason for o in outs if not isinstance(o, str)]
    assert reasons == ["http-500", "http-422", "timeout", "connect-error"]
    assert "***" in outs[0].detail  # the echo was there, and masked
    text = "\n".join(o if isinstance(o, str) else f"{o.reason} {o.detail}" for o in outs)
    assert SECRET not in text
    assert SECRET not in caplog.text


def test_the_pool_holds_concurrency_connections_and_no_more() -> None:
    async def body(base: str, seen: Seen) -> Any:
        effect = HttpEffect(f"{base}/slow", concurrency=2)
        try:
            return await asyncio.gather(*(_acall(effect, {"invoiceId": f"I{i}"}) for i in range(6)))
        finally:
            await effect.aclose()

    outs, seen = _with_server(body, delay=0.2)
    assert all(o.kind is Kind.SUCCESS for o in outs)
    assert seen.peak == 2 and len(seen.requests) == 6


def test_the_claims_preset_against_the_claim_system_as_0_1_0() -> None:
    """201 only is a success, 422 a rejection, 503 transient; the key is the message_id."""
    with partner() as p:

        async def main() -> list[Any]:
            effect = claims_http(p.url)
            outs = []
            try:
                for guid, claim_id, docs in [("g1", "C1", ["a"]), ("g2", "C2", []),
                                             ("g3", "BUSY-1", ["a"])]:  # fmt: skip
                    body = json.dumps({"guid": guid, "claimId": claim_id, "docs": docs}).encode()
                    d = Delivery(body=body, ref="1", headers={"message_id": guid})
                    decoded = CLAIMS.decode(d)
                    outs.append(await effect(d, decoded.fields))
            finally:
                await effect.aclose()
            return outs

        ok, refused, busy = asyncio.run(main())
        stats = p.stats()
    assert ok.kind is Kind.SUCCESS and "partner_duplicate" not in ok.fields
    assert (refused.kind, refused.reason) == (Kind.REJECTED, "http-422")
    assert (busy.kind, busy.reason) == (Kind.TRANSIENT, "http-503")
    assert stats["by_key"] == {"g1": 1, "g2": 1, "g3": 1}
