"""The effects without a network: StatusMap, PythonEffect, load_callable, HttpEffect's
checks, placeholders and repr. The requests themselves: tests/integration/test_http_effect.py.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from onceq._core.effect import PythonEffect, Reject, Retry, load_callable
from onceq._core.transport import Delivery, Kind
from onceq._effects.http import HttpEffect, StatusMap
from onceq._exercise.presets import claims_http
from onceq.errors import UsageError

# --- StatusMap -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "role"),
    [
        (200, "success"),
        (201, "success"),
        (204, "success"),
        (299, "success"),
        (409, "duplicate"),
        (400, "reject"),
        (404, "reject"),
        (422, "reject"),
        (408, "transient"),
        (425, "transient"),
        (429, "transient"),
        (500, "transient"),
        (503, "transient"),
        (100, "transient"),  # in no list: transient (a retry, then the dead letter)
        (302, "transient"),
    ],
)
def test_the_default_status_map(status: int, role: str) -> None:
    assert StatusMap().role(status) == role


def test_an_exact_code_wins_over_a_class_and_unlisted_is_transient() -> None:
    m = StatusMap.parse(success="2xx", duplicate="", reject="4xx,503", transient="404")
    assert [m.role(s) for s in (200, 409, 404, 503, 500, 302)] == [
        "success",
        "reject",
        "transient",
        "reject",
        "transient",
        "transient",
    ]


def test_parse_takes_lists_and_text_and_keeps_defaults_for_none() -> None:
    m = StatusMap.parse(success=[200, "201"], duplicate=" 409 , 410 ")
    assert m.success == (200, 201) and m.duplicate == (409, 410)
    assert m.reject == ("4xx",) and m.transient == ("5xx", 408, 425, 429)
    assert StatusMap.parse(reject="4XX").reject == ("4xx",)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"success": "600"}, "success: '600' is not an HTTP status"),
        ({"success": "99"}, "success: '99' is not an HTTP status"),
        ({"reject": "6xx"}, "reject: '6xx' is not an HTTP status"),
        ({"transient": "abc"}, "transient: 'abc' is not an HTTP status"),
        ({"duplicate": [True]}, "duplicate: True is not an HTTP status"),
        ({"success": "2xx,409"}, "duplicate: 409 is also in success"),
        ({"reject": "5xx"}, "transient: 5xx is also in reject"),
    ],
)
def test_a_bad_status_list_is_a_usage_error_naming_the_item(kwargs: dict, says: str) -> None:
    with pytest.raises(UsageError) as exc:
        StatusMap.parse(**kwargs)
    assert str(exc.value).startswith(says) and "\n" not in str(exc.value)


# --- HttpEffect: checks, placeholders, repr ---------------------------------------------


def test_a_placeholder_is_filled_url_encoded_from_the_doc() -> None:
    e = HttpEffect("http://127.0.0.1:1/api/{customer}/invoices/{invoice.id}?x=1")
    doc = {"customer": "A B/ä?#", "invoice": {"id": 7}}
    assert e.target({"doc": doc}) == "http://127.0.0.1:1/api/A%20B%2F%C3%A4%3F%23/invoices/7?x=1"


@pytest.mark.parametrize("doc", [{}, {"customer": None}, {"customer": {}}])
def test_a_placeholder_without_its_field_rejects_the_message(doc: dict) -> None:
    e = HttpEffect("http://127.0.0.1:1/api/{customer.name}")
    out = asyncio.run(e(Delivery(body=b"{}", ref="r", msg_id="m"), {"doc": doc}))
    assert (out.kind, out.reason, out.detail) == (Kind.REJECTED, "missing-field", "customer.name")


def test_what_no_request_can_carry_is_that_message_s_rejection() -> None:
    """An id with a control character (the orders preset allows one) cannot be a header
    value, a lone surrogate cannot be in a URL: dead at once, no request, no exception."""
    e = HttpEffect("http://127.0.0.1:1/api/{customer}")
    d = Delivery(body=b"{}", ref="r", msg_id="a\nb")
    out = asyncio.run(e(d, {"doc": {"customer": "c"}}))
    assert (out.kind, out.reason) == (Kind.REJECTED, "bad-id")
    d = Delivery(body=b"{}", ref="r", msg_id="m")
    out = asyncio.run(e(d, {"doc": {"customer": "\ud800"}}))
    assert (out.kind, out.reason, out.detail) == (
        Kind.REJECTED,
        "encoding",
        "customer holds a lone surrogate",
    )


@pytest.mark.parametrize(
    ("url", "kwargs", "says"),
    [
        ("ftp://h/x", {}, "url ftp://h/x: not an http:// or https:// URL"),
        ("http://{host}/x", {}, "a {field} may stand in the path or query only"),
        ("http://h:0/x", {}, "port 0"),
        ("http://h/{a..b}", {}, "url http://h/{a..b}: {a..b} is not a field (a.b.c)"),
        ("http://h/{}", {}, "{} is not a field"),
        ("http://h/api/{invoiceId", {}, "a '{' or '}' that is not a {field}"),
        ("http://h/api/}", {}, "a '{' or '}' that is not a {field}"),
        ("http://h/x", {"method": "PO ST"}, "method"),
        ("http://h/x", {"timeout": 0}, "timeout"),
        ("http://h/x", {"timeout": float("inf")}, "timeout: inf is not a positive number"),
        ("http://h/x", {"timeout": float("nan")}, "timeout: nan is not a positive number"),
        ("http://h/x", {"headers": {"Bad Name": "v"}}, "header Bad***: not a header name"),
        ("http://h/x", {"headers": {"X-Token": "s3cret\nx"}}, "header X-Token: its value"),
        ("http://h/x", {"idempotency_header": "a:b"}, "idempotency header"),
    ],
)
def test_an_effect_that_cannot_work_is_refused_in_one_line(
    url: str, kwargs: dict, says: str
) -> None:
    with pytest.raises(UsageError) as exc:
        HttpEffect(url, **kwargs)
    assert says in str(exc.value) and "\n" not in str(exc.value)
    assert "s3cret" not in str(exc.value)


def test_an_empty_success_list_is_refused() -> None:
    """No status would mean done: every message retried, then dead. `duplicate=""`
    (no status is a duplicate) stays allowed."""
    with pytest.raises(UsageError, match="success: an empty list"):
        StatusMap.parse(success="")
    assert StatusMap.parse(duplicate="").role(409) == "reject"


def test_repr_names_headers_never_their_values() -> None:
    e = HttpEffect("http://h/x", headers={"Authorization": "Bearer tok-SECRET-1"})
    text = repr(e)
    assert "Authorization" in text and "SECRET" not in text and "http://h/x" in text


def test_the_claims_preset_is_base_v1_claims_with_only_201_a_success() -> None:
    e = claims_http("http://127.0.0.1:9/", concurrency=3, timeout=2.5)
    assert e.url == "http://127.0.0.1:9/v1/claims" and e.concurrency == 3 and e.timeout == 2.5
    roles = {s: e.statuses.role(s) for s in (200, 201, 202, 409, 400, 422, 404, 503)}
    assert roles == {
        200: "transient",
        201: "success",
        202: "transient",
        409: "transient",
        400: "transient",
        422: "reject",
        404: "transient",
        503: "transient",
    }
    with pytest.raises(UsageError, match="--claim "):
        claims_http("amqp://x")


# --- PythonEffect ---------------------------------------------------------------------


def _run(function: Any, doc: dict | None = None) -> Any:
    effect = PythonEffect(function)
    fields = {"group": None, "seq": None, "kept": {}, "doc": doc or {"id": "1"}}
    return asyncio.run(effect(Delivery(body=b"{}", ref="r", msg_id="1"), fields))


def test_a_sync_function_runs_off_the_loop_thread_and_returning_is_success() -> None:
    seen: list[Any] = []

    def handler(doc: dict) -> None:
        seen.append((doc, threading.current_thread() is threading.main_thread()))

    out = _run(handler, {"id": "A"})
    assert out.kind is Kind.SUCCESS and out.fields["doc"] == {"id": "A"}
    assert seen == [({"id": "A"}, False)]


def test_a_blocking_sync_function_does_not_stall_the_loop() -> None:
    """Two 0.3 s sleeps at once finish in ~0.3 s, and a loop timer fires meanwhile."""
    import time

    async def main() -> tuple[float, int]:
        effect = PythonEffect(lambda doc: time.sleep(0.3))
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.create_task(tick())
        start = time.monotonic()
        d = Delivery(body=b"{}", ref="r", msg_id="1")
        await asyncio.gather(effect(d, {"doc": {}}), effect(d, {"doc": {}}))
        t.cancel()
        return time.monotonic() - start, ticks

    took, ticks = asyncio.run(main())
    assert took < 0.55 and ticks >= 10


def test_an_async_function_is_awaited_on_the_loop() -> None:
    seen: list[bool] = []

    async def handler(doc: dict) -> None:
        await asyncio.sleep(0)
        seen.append(threading.current_thread() is threading.main_thread())

    assert _run(handler).kind is Kind.SUCCESS and seen == [True]

    class Handler:
        async def __call__(self, doc: dict) -> None:
            seen.append(True)

    assert _run(Handler()).kind is Kind.SUCCESS and len(seen) == 2


@pytest.mark.parametrize(
    ("exc", "kind", "reason", "detail"),
    [
        (Reject("total is negative"), Kind.REJECTED, "rejected", "total is negative"),
        (Retry("partner busy"), Kind.TRANSIENT, "retry", "partner busy"),
        (KeyError("x"), Kind.TRANSIENT, "internal-error", "KeyError: 'x'"),
        (ValueError("x" * 500), Kind.TRANSIENT, "internal-error", "ValueError: " + "x" * 188),
        (RuntimeError("see amqp://u:pw@h/v"), Kind.TRANSIENT, "internal-error", None),
    ],
)
@pytest.mark.parametrize("is_async", [False, True])
def test_raising_is_reject_retry_or_internal_error(
    exc: Exception, kind: Kind, reason: str, detail: str | None, is_async: bool
) -> None:
    def sync(doc: dict) -> None:
        raise exc

    async def coro(doc: dict) -> None:
        raise exc

    out = _run(coro if is_async else sync)
    assert (out.kind, out.reason) == (kind, reason)
    if detail is not None:
        assert out.detail == detail
    assert "pw" not in out.detail and len(out.detail) <= 200


# --- load_callable --------------------------------------------------------------------


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "onceq_user_mod.py").write_text(
        "def save(doc):\n    return doc\n"
        "class Box:\n    @staticmethod\n    def put(doc):\n        return 1\n"
        "NOT_CALLABLE = 3\n"
    )
    (tmp_path / "onceq_broken_mod.py").write_text("def f(:\n")
    (tmp_path / "onceq_raising_mod.py").write_text("import onceq_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "onceq_user_mod"
    for name in ("onceq_user_mod", "onceq_broken_mod", "onceq_raising_mod"):
        sys.modules.pop(name, None)


def test_load_callable_finds_a_function_and_a_dotted_attribute(user_module: str) -> None:
    assert load_callable(f"{user_module}:save")({"a": 1}) == {"a": 1}
    assert load_callable(f"{user_module}:Box.put")({}) == 1


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("onceq_user_mod.save", "'onceq_user_mod.save': not module:function (one colon)"),
        ("a:b:c", "not module:function (one colon)"),
        (":save", ":save: not module:function (both parts needed)"),
        ("onceq_user_mod:", "both parts needed"),
        ("onceq_no_such_mod:f", "onceq_no_such_mod:f: no module named onceq_no_such_mod"),
        ("onceq_user_mod:nope", "onceq_user_mod:nope: onceq_user_mod has no attribute nope"),
        ("onceq_user_mod:NOT_CALLABLE", "NOT_CALLABLE is a int, not callable"),
        ("onceq_broken_mod:f", "onceq_broken_mod:f: importing onceq_broken_mod failed: Syntax"),
        ("onceq_raising_mod:f", "importing onceq_raising_mod failed: ModuleNotFoundError"),
    ],
)
def test_load_callable_errors_are_one_line_naming_the_string(
    user_module: str, spec: str, says: str
) -> None:
    with pytest.raises(UsageError) as exc:
        load_callable(spec)
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_python_effect_refuses_what_is_not_callable() -> None:
    with pytest.raises(UsageError, match="not callable"):
        PythonEffect(3)  # type: ignore[arg-type]
