"""The console's JSON API: what the page reads and does, for scripts too.

Every route is in ROUTES and in the OpenAPI document (`openapi.py`; a test holds the
two equal, and a property-based run holds the answers to the document). Errors are
`{"error": one line}` with the status of ERROR_STATUS: a user's mistake is a 4xx,
never a traceback.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from onceq import __version__
from onceq._console.openapi import document
from onceq._console.state import ConsoleState
from onceq._core.redact import redact_text
from onceq._sources.dead_api import DeadSelection
from onceq.errors import (
    BadMessage,
    BrokerUnavailable,
    Conflict,
    LedgerUnavailable,
    NotFound,
    OnceqError,
    UsageError,
)

STATE: web.AppKey[ConsoleState] = web.AppKey("state", ConsoleState)
CSRF: web.AppKey[str] = web.AppKey("csrf", str)
# The most specific class first: LedgerUnavailable is a LedgerError.
ERROR_STATUS: tuple[tuple[type[OnceqError], int], ...] = (
    (NotFound, 404),
    (UsageError, 400),
    (Conflict, 409),
    (BadMessage, 422),
    (BrokerUnavailable, 503),
    (LedgerUnavailable, 503),
    (OnceqError, 502),
)
MAX_KEYS = 1000  # keys one action may name
_REQUEST_ID = re.compile(r"^[A-Za-z0-9_-]{8,64}$")


def status_of(exc: OnceqError) -> int:
    return next(code for cls, code in ERROR_STATUS if isinstance(exc, cls))


@web.middleware
async def errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except OnceqError as exc:
        return web.json_response({"error": redact_text(str(exc))}, status=status_of(exc))


def _state(request: web.Request) -> ConsoleState:
    return request.app[STATE]


async def session(request: web.Request) -> web.Response:
    s = _state(request)
    return web.json_response(
        {"csrf": request.app[CSRF], "read_only": s.read_only, "version": __version__}
    )


async def flows(request: web.Request) -> web.Response:
    return web.json_response(await _state(request).overview())


async def failures(request: web.Request) -> web.Response:
    return web.json_response(await _state(request).failures())


async def group(request: web.Request) -> web.Response:
    flow = request.match_info["flow"]
    reason = _text(request.query.get("reason"), "reason", required=True)
    items = await _state(request).items(flow, DeadSelection(reason=reason))
    return web.json_response(
        {"flow": flow, "reason": reason, "items": [i.as_dict() for i in items]}
    )


async def message(request: web.Request) -> web.Response:
    flow = request.match_info["flow"]
    key = _text(request.query.get("key"), "key", required=True)
    return web.json_response(await _state(request).message(flow, key))


async def search(request: web.Request) -> web.Response:
    msg_id = _text(request.query.get("id"), "id", required=True)
    s = _state(request)
    return web.json_response({"id": msg_id, "journeys": await s.journeys(msg_id, list(s.flows))})


async def act(request: web.Request) -> web.Response:
    flow, action = request.match_info["flow"], request.match_info["action"]
    try:
        doc = await request.json()
    except ValueError:
        raise UsageError("the body is not JSON") from None
    if not isinstance(doc, dict):
        raise UsageError("the body is not a JSON object")
    keys = doc.get("keys", [])
    reason = doc.get("reason")
    if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
        raise UsageError("keys: a list of dead letters' keys (non-empty strings)")
    if len(keys) > MAX_KEYS:
        raise UsageError(f"keys: at most {MAX_KEYS} in one action")
    if reason is not None:
        reason = _text(reason, "reason", required=True)
    if bool(keys) == (reason is not None):
        raise UsageError("give keys or reason (one of them): which dead letters to take")
    expect = doc.get("expect")
    if not isinstance(expect, int) or isinstance(expect, bool) or expect < 1:
        raise UsageError("expect: the number of dead letters confirmed (1 or more)")
    request_id = doc.get("request_id")
    if not isinstance(request_id, str) or not _REQUEST_ID.match(request_id):
        raise UsageError("request_id: 8-64 letters, digits, - or _ (one per submit)")
    selection = DeadSelection(keys=tuple(dict.fromkeys(keys)), reason=reason)
    answer = await _state(request).act(action, flow, selection, expect, request_id)
    return web.json_response(answer)


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(document(read_only=_state(request).read_only))


def _text(value: Any, name: str, *, required: bool = False) -> str:
    if not isinstance(value, str) or (required and not value.strip()):
        raise UsageError(f"{name}: required, a non-empty string")
    if len(value) > 1024 or "\x00" in value:
        raise UsageError(f"{name}: too long or not text")
    return value


# (method, path, handler, changes something)
ROUTES = (
    ("GET", "/api/session", session, False),
    ("GET", "/api/flows", flows, False),
    ("GET", "/api/failures", failures, False),
    ("GET", "/api/failures/{flow}", group, False),
    ("GET", "/api/flows/{flow}/dead", message, False),
    ("GET", "/api/search", search, False),
    ("POST", "/api/flows/{flow}/dead/{action:replay|purge}", act, True),
    ("GET", "/api/openapi.json", openapi, False),
)


def add_routes(app: web.Application, read_only: bool) -> None:
    """The routes; a read-only console has no route that changes anything at all."""
    for method, path, handler, changes in ROUTES:
        if changes and read_only:
            continue
        app.router.add_route(method, path, handler)
