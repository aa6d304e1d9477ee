"""Header mistakes are refused before anything is consumed, and never show a value;
an exception out of an effect is one line (no traceback) and a configuration error
is dead at once (config-error), not retried as transient.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from onceq._core.consumer import Consumer, Outcome
from onceq._core.redact import forget_all, redact_text
from onceq._core.transport import Delivery, Kind
from onceq._effects.http import HttpEffect
from onceq._effects.http_headers import parse_header_arg, request_headers
from onceq._ledger.sqlite import Ledger
from onceq._sources.memory import MemoryTransport
from onceq.errors import UsageError

SECRET = "abcSecret1"


@pytest.fixture(autouse=True)
def _forget() -> Any:
    yield
    forget_all()


@pytest.mark.parametrize(
    ("arg", "says"),
    [
        (f"X-Api-Key={SECRET}", "header X-Api-Key=***: not 'NAME: VALUE' ('=' instead of ':')"),
        (f"Authorization Bearer {SECRET}", "header Authorization ***: not 'NAME: VALUE' (no ':'"),
        (f"X-Api-Key {SECRET}", "header X-Api-Key ***: not 'NAME: VALUE' (no ':' after"),
        (SECRET, "header ***: not 'NAME: VALUE' (no ':' in it)"),
        (f"{SECRET}=", "header ***: not 'NAME: VALUE' (no ':' in it)"),
        (f": {SECRET}", "header : ***: not 'NAME: VALUE' (no name before the ':')"),
        (f"Authorization Bearer a:{SECRET}", "header Authorization***: not 'NAME: VALUE' (the"),
        (f"Authorizatión: {SECRET}", "header Authorizati***: not"),
        (f"\tX-Api-Key \t= {SECRET} ", "header X-Api-Key ***: not"),
        ("", "header ***: not 'NAME: VALUE'"),
    ],
)
def test_a_mistyped_header_shows_only_its_name_and_remembers_the_rest(arg: str, says: str) -> None:
    with pytest.raises(UsageError) as exc:
        parse_header_arg(arg)
    assert str(exc.value).startswith(says), str(exc.value)
    assert "Secret1" not in str(exc.value)
    if arg:  # whatever else prints it later is masked too
        assert "Secret1" not in redact_text(f"echo: {arg} / {json.dumps(arg)}")


def test_a_well_formed_header_keeps_its_name_and_value() -> None:
    assert parse_header_arg(" Authorization :  Bearer ${T} ") == ("Authorization", "Bearer ${T}")
    assert parse_header_arg("X-Key:") == ("X-Key", "")


@pytest.mark.parametrize(
    ("url", "headers", "idem", "says"),
    [
        ("http://bob:pw@h/x", {"Authorization": "Bearer t"}, None, "credentials in the URL"),
        ("http://bob@h/x", {"authorization": "Bearer t"}, None, "credentials in the URL"),
        ("http://:pw@h/x", {"AUTHORIZATION": "t"}, None, "credentials in the URL"),
        ("http://bob:pw@h/x", {}, "Authorization", "credentials in the URL"),
        ("http://h/x", {"X-Key": "a\r\nHost: evil"}, None, "header X-Key: its value is not one"),
        ("http://h/x", {"X-Key": "a\tb"}, None, "header X-Key: its value is not one line"),
        ("http://h/x", {"X-Key": "a\ud800b"}, None, "header X-Key: its value holds a byte"),
        ("http://h/x", {"X Key": "v"}, None, "header X***: not a header name"),
        ("http://h/x", {"": "v"}, None, "header ***: not a header name"),
        ("http://h/x", {"Content-Length": "5"}, None, "header Content-Length: the HTTP client"),
        ("http://h/x", {"transfer-encoding": "chunked"}, None, "header transfer-encoding:"),
        ("http://h/x", {"X-Key": "a", "x-key": "b"}, None, "header x-key: X-Key is given already"),
        ("http://h/x", {"Idempotency-Key": "k"}, "Idempotency-Key", "idempotency header Idem"),
        ("http://h/x", {}, "Content-Length", "idempotency header Content-Length: the HTTP"),
        ("http://h/x", {}, "a:b", "idempotency header a***: not a header name"),
    ],
)
def test_what_the_http_client_would_refuse_is_refused_up_front(
    url: str, headers: dict[str, str], idem: str | None, says: str
) -> None:
    for build in (
        lambda: request_headers(url, headers, idem),
        lambda: HttpEffect(url, headers=headers, idempotency_header=idem),
    ):
        with pytest.raises(UsageError) as exc:
            build()
        text = str(exc.value)
        assert says in text and "\n" not in text and ":pw" not in text, text
        assert "Bearer t" not in text and "evil" not in text


def test_a_content_type_of_ones_own_replaces_the_default() -> None:
    sent = request_headers("http://h/x", {"content-type": "text/plain"}, "Idempotency-Key")
    assert sent == {"content-type": "text/plain"}
    assert request_headers("http://bob:pw@h/x", {"X-Key": "v"}, None)["X-Key"] == "v"


def test_the_conflict_refused_is_the_one_aiohttp_raises() -> None:
    """The check and aiohttp agree: the same URL and header fail in aiohttp's request."""

    async def main() -> str:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(ValueError) as exc:
                await session.post("http://bob@127.0.0.1:9/x", headers={"authorization": "t"})
        return str(exc.value)

    assert "Cannot combine AUTHORIZATION header" in asyncio.run(main())
    with pytest.raises(UsageError, match="credentials in the URL"):
        request_headers("http://bob@127.0.0.1:9/x", {"authorization": "t"}, None)


# --- an exception out of an effect --------------------------------------------------------


def _call(effect: HttpEffect) -> Outcome:
    async def main() -> Outcome:
        try:
            d = Delivery(body=b"{}", ref="a.json", msg_id="INV-1")
            return await effect(d, {"doc": {}})
        finally:
            await effect.aclose()

    return asyncio.run(main())


def test_a_config_error_from_aiohttp_is_dead_at_once_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What slips past the checks (here: the conflict, put back after them) is not
    transient: every message would fail the same way. One ERROR line, the traceback
    only at DEBUG, the secret masked in both and in the detail."""
    effect = HttpEffect("http://bob:pw@127.0.0.1:9/x", idempotency_header=None)
    effect._headers["Authorization"] = f"Bearer {SECRET}"
    effect._secrets = (f"Bearer {SECRET}", SECRET)
    with caplog.at_level(logging.DEBUG, logger="onceq.effect"):
        out = _call(effect)
    assert (out.kind, out.reason) == (Kind.REJECTED, "config-error")
    assert out.detail.startswith("ValueError: Cannot combine AUTHORIZATION header")
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is None
    line = errors[0].getMessage()
    assert "message INV-1" in line and "config-error" in line and "ValueError" in line, line
    assert "--log-level debug" in line
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(debug) == 1 and debug[0].exc_info is not None
    assert SECRET not in out.detail + line


def test_a_bug_in_a_handler_is_one_line_and_stays_a_transient_internal_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def handler(d: Delivery, fields: dict[str, Any]) -> Outcome:
        raise RuntimeError(f"bug quoting amqp://u:{SECRET}@h")

    def decode(d: Delivery) -> Outcome:
        d.msg_id = json.loads(d.body)["id"]
        return Outcome(Kind.SUCCESS, fields={})

    t = MemoryTransport()
    t.publish(b'{"id": "e1"}', ref="e1.json")
    with Ledger(tmp_path / "l.db") as ledger, caplog.at_level(logging.WARNING):
        stats = asyncio.run(Consumer(t, ledger, decode, handler, max_attempts=2).run())
        rows = ledger.dead_letters()
    assert stats.requeued == 1 and stats.dead == 1  # transient: retried, then dead
    assert [r["reason"] for r in rows] == ["internal-error"]
    assert rows[0]["detail"] == "RuntimeError: bug quoting amqp://u:***@h"
    lines = [r for r in caplog.records if r.name == "onceq.effect"]
    assert len(lines) == 2 and all(r.exc_info is None for r in lines)
    assert "message e1: the effect raised RuntimeError" in lines[0].getMessage()
    assert "retried as internal-error" in lines[0].getMessage()


def test_a_flow_file_names_the_key_of_each_header_mistake_once(tmp_path: Path) -> None:
    from onceq._flows.file import FlowFileError, load_flows

    flows = tmp_path / "flows.toml"
    flows.write_text(
        'ledger = "l.db"\n[flows.a]\nsource = "dirq"\npath = "q"\n[flows.a.http]\n'
        'url = "http://h/x"\nheaders = { Authorization = 123, "X-Key: abcSecret1" = "v" }\n'
        '[flows.b]\nsource = "dirq"\npath = "q2"\n[flows.b.http]\n'
        'url = "http://bob:pwSecret9@h/x"\nheaders = { authorization = "Bearer t" }\n'
        'idempotency_header = "Content-Length"\n'
    )
    with pytest.raises(FlowFileError) as exc:
        load_flows(flows)
    assert exc.value.lines == [
        f"{flows}: line 7: flows.a.http.headers.Authorization: must be text, not an integer",
        f"{flows}: line 7: flows.a.http.headers.X-Key***: not a header name",
        f"{flows}: line 14: flows.b.http.idempotency_header: Content-Length: the HTTP client"
        " sets it from each message's body",
    ]
