"""The OpenAPI 3.0 document of the console's JSON API (served at /api/openapi.json).

Written as data beside the routes (`api.ROUTES`; tests/unit/test_console_api.py holds
the paths equal, and a property-based run holds every answer to these schemas).
"""

from __future__ import annotations

from typing import Any

from onceq import __version__

_STR = {"type": "string"}
_NSTR = {"type": "string", "nullable": True}
_INT = {"type": "integer"}
_NINT = {"type": "integer", "nullable": True}
_ERROR = {
    "description": "refused or failed: one line, nothing changed",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["error"],
                "properties": {"error": _STR},
            }
        }
    },
}


def _ok(schema: dict[str, Any], what: str) -> dict[str, Any]:
    return {"description": what, "content": {"application/json": {"schema": schema}}}


def _obj(required: list[str], **props: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": props}


STEP = _obj(
    ["at", "step"],
    at=_STR,
    step={
        "type": "string",
        "enum": ["retry", "delayed", "dead", "replayed", "purged", "duplicate", "done"],
    },
    ref=_NSTR,
    attempt=_NINT,
    reason=_NSTR,
    detail=_NSTR,
    delay_s={"type": "number", "nullable": True},
    op={"type": "object", "nullable": True},
)
JOURNEY = _obj(
    ["flow", "msg_id", "state", "steps", "kept"],
    flow=_STR,
    msg_id=_NSTR,
    state=_STR,
    steps={"type": "array", "items": STEP},
    kept={"type": "object"},
)
ITEM = _obj(
    ["key", "msg_id", "reason", "attempts", "died_at", "size", "where", "properties"],
    key=_STR,
    msg_id=_NSTR,
    reason=_STR,
    detail=_NSTR,
    attempts=_NINT,
    died_at=_NSTR,
    size=_INT,
    where=_STR,
    properties={"type": "object"},
)
JOURNEYS = {"type": "array", "items": JOURNEY}
MESSAGE = {
    "allOf": [
        ITEM,
        _obj(
            ["body", "body_json", "body_cut", "journeys"],
            body=_STR,
            body_json={"type": "boolean"},
            body_cut=_NSTR,
            journeys={"type": "array", "items": JOURNEY},
        ),
    ]
}
# One labelled depth of a flow's queue, as its source type names it (the page's columns).
DEPTH = _obj(
    ["key", "label", "value", "unit"],
    key=_STR,
    label=_STR,
    value={"type": "number", "nullable": True},
    unit=_NSTR,
)
FLOW = _obj(
    [
        "source",
        "queue",
        "depths",
        "queue_error",
        "ledger",
        "consumers",
        "breaker",
        "rates",
        "actions",
    ],
    source=_NSTR,
    queue={"type": "object", "nullable": True},
    depths={"type": "array", "items": DEPTH},
    queue_error=_NSTR,
    ledger={"type": "object", "nullable": True},
    consumers={"type": "array", "items": {"type": "object"}},
    breaker={"nullable": True},
    rates=_obj(
        ["per_minute", "over_s", "spark"],
        per_minute={"type": "object", "nullable": True},
        over_s={"type": "number", "nullable": True},
        spark={"type": "array", "items": _INT},
    ),
    actions={"type": "array", "items": {"type": "string", "enum": ["replay", "purge"]}},
)
GROUP = _obj(
    ["flow", "reason", "count", "first", "last", "where"],
    flow=_STR,
    reason=_STR,
    count=_INT,
    first=_NSTR,
    last=_NSTR,
    where=_STR,
)
ACTION_BODY = _obj(
    ["expect", "request_id"],
    keys={"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 1000},
    reason={"type": "string", "minLength": 1},
    expect={"type": "integer", "minimum": 1},
    request_id={"type": "string", "pattern": "^[A-Za-z0-9_-]{8,64}$"},
)
ANSWER = _obj(
    ["action", "matched", "done", "skipped", "op", "flow", "repeated"],
    action=_STR,
    matched=_INT,
    done=_INT,
    skipped={"type": "array", "items": _obj(["key", "why"], key=_STR, why=_STR)},
    op=_NINT,
    flow=_STR,
    repeated={"type": "boolean"},
)


def _query(name: str, what: str) -> dict[str, Any]:
    schema = {"type": "string", "minLength": 1, "maxLength": 1024}
    return {"name": name, "in": "query", "required": True, "schema": schema, "description": what}


_FLOW_PARAM = {"name": "flow", "in": "path", "required": True, "schema": _STR}
_REFUSED = {"403": _ERROR}


def document(read_only: bool = False) -> dict[str, Any]:
    paths: dict[str, Any] = {
        "/api/session": {
            "get": {
                "summary": "The page's CSRF token and whether the console is read-only",
                "responses": {
                    "200": _ok(
                        _obj(
                            ["csrf", "read_only", "version"],
                            csrf=_STR,
                            read_only={"type": "boolean"},
                            version=_STR,
                        ),
                        "the session",
                    ),
                    **_REFUSED,
                },
            }
        },
        "/api/flows": {
            "get": {
                "summary": "Every flow: queue depths, ledger counts, rates, consumers",
                "responses": {
                    "200": _ok(
                        _obj(
                            ["generated_at", "ledger", "flows", "read_only"],
                            generated_at=_STR,
                            ledger={"type": "object"},
                            flows={"type": "object", "additionalProperties": FLOW},
                            read_only={"type": "boolean"},
                        ),
                        "the flows",
                    ),
                    **_REFUSED,
                },
            }
        },
        "/api/failures": {
            "get": {
                "summary": "Dead letters grouped by flow and reason",
                "responses": {
                    "200": _ok(
                        _obj(
                            ["groups", "errors"],
                            groups={"type": "array", "items": GROUP},
                            errors={"type": "object", "additionalProperties": _STR},
                        ),
                        "the groups",
                    ),
                    **_REFUSED,
                },
            }
        },
        "/api/failures/{flow}": {
            "get": {
                "summary": "One group's dead letters",
                "parameters": [_FLOW_PARAM, _query("reason", "the group's reason")],
                "responses": {
                    "200": _ok(
                        _obj(
                            ["flow", "reason", "items"],
                            flow=_STR,
                            reason=_STR,
                            items={"type": "array", "items": ITEM},
                        ),
                        "the group",
                    ),
                    "400": _ERROR,
                    "404": _ERROR,
                    **_REFUSED,
                },
            }
        },
        "/api/flows/{flow}/dead": {
            "get": {
                "summary": "One dead letter: body, properties, journey",
                "parameters": [_FLOW_PARAM, _query("key", "the dead letter's key")],
                "responses": {
                    "200": _ok(MESSAGE, "the dead letter"),
                    "400": _ERROR,
                    "404": _ERROR,
                    **_REFUSED,
                },
            }
        },
        "/api/search": {
            "get": {
                "summary": "A message's journeys in every flow, by its exact id",
                "parameters": [_query("id", "the message id")],
                "responses": {
                    "200": _ok(
                        _obj(
                            ["id", "journeys"],
                            id=_STR,
                            journeys={"type": "array", "items": JOURNEY},
                        ),
                        "the journeys",
                    ),
                    "400": _ERROR,
                    **_REFUSED,
                },
            }
        },
        "/api/openapi.json": {
            "get": {
                "summary": "This document",
                "responses": {"200": _ok({"type": "object"}, "the document")},
            }
        },
    }
    if not read_only:
        paths["/api/flows/{flow}/dead/{action}"] = {
            "post": {
                "summary": "Replay or purge dead letters (X-CSRF-Token from /api/session)",
                "parameters": [
                    _FLOW_PARAM,
                    {
                        "name": "action",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "enum": ["replay", "purge"]},
                    },
                    {"name": "X-CSRF-Token", "in": "header", "required": True, "schema": _STR},
                ],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": ACTION_BODY}},
                },
                "responses": {
                    "200": _ok(ANSWER, "what was done"),
                    "400": _ERROR,
                    "404": _ERROR,
                    "409": _ERROR,
                    "422": _ERROR,
                    **_REFUSED,
                },
            }
        }
    return {
        "openapi": "3.0.3",
        "info": {"title": "onceq console", "version": __version__},
        "paths": paths,
        "components": {
            "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}},
        },
    }
