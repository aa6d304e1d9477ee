"""The console's API and its guard, in-process over a real directory queue and ledger:
who may read, who may change, what a refused request leaves (nothing), double
submits, confirmed counts, read-only mode, and the routes against the OpenAPI document."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from console_support import dead_queue
from onceq import Flow
from onceq._console.api import ROUTES
from onceq._console.guard import check_bind, read_token
from onceq._console.openapi import document
from onceq._console.server import make_app
from onceq._console.state import ConsoleState
from onceq.errors import UsageError

TOKEN = "t0ken-for-the-console-tests"


def queue_with_dead(tmp_path: Path, n: int = 6) -> tuple[Flow, Path]:
    """A directory queue whose odd messages died (reason rejected), and its ledger."""
    flow, _root, ledger = dead_queue(tmp_path, n)
    return flow, ledger


Check = Callable[[TestClient[Any, Any]], Awaitable[None]]


def serve(state: ConsoleState, check: Check, token: str | None = None) -> None:
    async def main() -> None:
        app = make_app(state, token)
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            await check(client)

    asyncio.run(main())


async def csrf(client: TestClient[Any, Any], headers: dict[str, str] | None = None) -> str:
    r = await client.get("/api/session", headers=headers or {})
    assert r.status == 200
    return str((await r.json())["csrf"])


def error_names(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "q" / "error").iterdir())


def test_failures_are_grouped_and_a_message_shows_body_and_journey(tmp_path: Path) -> None:
    flow, ledger = queue_with_dead(tmp_path)

    async def check(client: TestClient[Any, Any]) -> None:
        doc = await (await client.get("/api/failures")).json()
        assert [(g["flow"], g["reason"], g["count"]) for g in doc["groups"]] == [
            ("f", "rejected", 3)
        ]
        group = await (await client.get("/api/failures/f", params={"reason": "rejected"})).json()
        assert [i["key"] for i in group["items"]] == ["m1.json", "m3.json", "m5.json"]
        m = await (await client.get("/api/flows/f/dead", params={"key": "m3.json"})).json()
        assert json.loads(m["body"]) == {"id": "m3", "n": 3} and m["body_json"] is True
        assert [s["step"] for s in m["journeys"][0]["steps"]] == ["dead"]
        found = await (await client.get("/api/search", params={"id": "m2"})).json()
        assert found["journeys"][0]["state"] == "done"
        flows = await (await client.get("/api/flows")).json()
        assert flows["flows"]["f"]["ledger"]["processed"] == 3
        assert flows["flows"]["f"]["actions"] == ["purge", "replay"]

    serve(ConsoleState([flow], ledger), check)


def test_a_replay_needs_the_csrf_token_and_a_same_origin(tmp_path: Path) -> None:
    flow, ledger = queue_with_dead(tmp_path)
    before = error_names(tmp_path)
    body = {"keys": ["m1.json"], "expect": 1, "request_id": "req-00000001"}

    async def check(client: TestClient[Any, Any]) -> None:
        url = "/api/flows/f/dead/replay"
        r = await client.post(url, json=body)
        assert r.status == 403 and "X-CSRF-Token" in (await r.json())["error"]
        r = await client.post(url, json=body, headers={"X-CSRF-Token": "wrong"})
        assert r.status == 403
        token = await csrf(client)
        evil = {"X-CSRF-Token": token, "Origin": "http://evil.example"}
        r = await client.post(url, json=body, headers=evil)
        assert r.status == 403 and "another origin" in (await r.json())["error"]
        assert error_names(tmp_path) == before  # nothing changed by a refusal
        r = await client.post(url, json=body, headers={"X-CSRF-Token": token})
        assert r.status == 200, await r.text()
        assert (await r.json())["done"] == 1
        assert "m1.json" not in error_names(tmp_path)
        assert (tmp_path / "q" / "inbox" / "m1.json").exists()

    serve(ConsoleState([flow], ledger), check)


def test_a_double_submit_and_a_second_click_replay_nothing_twice(tmp_path: Path) -> None:
    flow, ledger = queue_with_dead(tmp_path)

    async def check(client: TestClient[Any, Any]) -> None:
        h = {"X-CSRF-Token": await csrf(client)}
        url = "/api/flows/f/dead/replay"
        body = {"reason": "rejected", "expect": 3, "request_id": "req-same-0001"}
        first, twin = await asyncio.gather(
            client.post(url, json=body, headers=h), client.post(url, json=body, headers=h)
        )
        answers = [await first.json(), await twin.json()]
        assert sorted(a["repeated"] for a in answers) == [False, True]
        assert all(a["done"] == 3 and a["op"] == answers[0]["op"] for a in answers)
        # A new submit of the same selection: nothing is dead any more, nothing is done.
        again = await client.post(url, json={**body, "request_id": "req-new-00002"}, headers=h)
        assert again.status == 409 and "0 dead letter(s) match now" in (await again.json())["error"]

    serve(ConsoleState([flow], ledger), check)
    assert error_names(tmp_path) == []
    with __import__("sqlite3").connect(ledger) as db:
        assert db.execute("SELECT count(*) FROM replays").fetchone() == (3,)
        assert db.execute("SELECT count(*) FROM dead_ops").fetchone() == (1,)


def test_a_changed_count_is_refused(tmp_path: Path) -> None:
    flow, ledger = queue_with_dead(tmp_path)
    before = error_names(tmp_path)

    async def check(client: TestClient[Any, Any]) -> None:
        h = {"X-CSRF-Token": await csrf(client)}
        body = {"reason": "rejected", "expect": 2, "request_id": "req-00000003"}
        r = await client.post("/api/flows/f/dead/replay", json=body, headers=h)
        assert (
            r.status == 409
            and "3 dead letter(s) match now, 2 were confirmed" in (await r.json())["error"]
        )

    serve(ConsoleState([flow], ledger), check)
    assert error_names(tmp_path) == before


def test_a_purge_removes_the_selected_files_audited_and_the_journey_says_so(
    tmp_path: Path,
) -> None:
    flow, ledger = queue_with_dead(tmp_path)

    async def check(client: TestClient[Any, Any]) -> None:
        h = {"X-CSRF-Token": await csrf(client)}
        body = {"keys": ["m3.json"], "expect": 1, "request_id": "req-purge-001"}
        r = await client.post("/api/flows/f/dead/purge", json=body, headers=h)
        assert r.status == 200, await r.text()
        answer = await r.json()
        assert (answer["matched"], answer["done"], answer["skipped"]) == (1, 1, [])
        found = await (await client.get("/api/search", params={"id": "m3"})).json()
        assert [s["step"] for s in found["journeys"][0]["steps"]] == ["dead", "purged"]
        assert found["journeys"][0]["state"] == "purged"

    serve(ConsoleState([flow], ledger), check)
    assert error_names(tmp_path) == ["m1.json", "m5.json"]
    with __import__("sqlite3").connect(ledger) as db:
        rows = db.execute("SELECT transport, op, ids, count, finished_at IS NOT NULL FROM dead_ops")
        assert rows.fetchall() == [("dirq", "purge", '["m3"]', 1, 1)]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"expect": 1, "request_id": "req-00000004"}, "give keys or reason"),
        ({"keys": ["a"], "reason": "r", "expect": 1, "request_id": "req-00000004"}, "one of"),
        ({"keys": ["a"], "expect": 0, "request_id": "req-00000004"}, "expect"),
        ({"keys": ["a"], "expect": True, "request_id": "req-00000004"}, "expect"),
        ({"keys": ["a"], "expect": 1, "request_id": "<script>"}, "request_id"),
        ({"keys": [""], "expect": 1, "request_id": "req-00000004"}, "keys"),
        ([1, 2], "not a JSON object"),
    ],
)
def test_bad_action_bodies_are_400_and_change_nothing(tmp_path: Path, body: Any, says: str) -> None:
    flow, ledger = queue_with_dead(tmp_path)
    before = error_names(tmp_path)

    async def check(client: TestClient[Any, Any]) -> None:
        h = {"X-CSRF-Token": await csrf(client)}
        r = await client.post("/api/flows/f/dead/replay", json=body, headers=h)
        assert r.status == 400 and says in (await r.json())["error"]

    serve(ConsoleState([flow], ledger), check)
    assert error_names(tmp_path) == before


def test_with_a_token_every_api_request_needs_it(tmp_path: Path) -> None:
    flow, ledger = queue_with_dead(tmp_path)
    before = error_names(tmp_path)

    async def check(client: TestClient[Any, Any]) -> None:
        assert (await client.get("/api/flows")).status == 403
        bad = {"Authorization": "Bearer " + "x" * len(TOKEN)}
        assert (await client.get("/api/flows", headers=bad)).status == 403
        good = {"Authorization": f"Bearer {TOKEN}"}
        assert (await client.get("/api/flows", headers=good)).status == 200
        assert (await client.get("/")).status == 200  # the page itself holds nothing
        token = await csrf(client, good)
        body = {"keys": ["m1.json"], "expect": 1, "request_id": "req-00000005"}
        r = await client.post(
            "/api/flows/f/dead/replay", json=body, headers={"X-CSRF-Token": token}
        )
        assert r.status == 403  # the CSRF token alone is not the token
        assert error_names(tmp_path) == before

    serve(ConsoleState([flow], ledger), check, token=TOKEN)


def test_without_a_token_only_a_local_host_header_is_answered(tmp_path: Path) -> None:
    """DNS rebinding: a page of evil.example resolved to 127.0.0.1 sends Host: evil.example."""
    flow, ledger = queue_with_dead(tmp_path)

    async def check(client: TestClient[Any, Any]) -> None:
        r = await client.get("/api/flows", headers={"Host": "evil.example:8025"})
        assert r.status == 403
        assert (await client.get("/api/flows", headers={"Host": "localhost:8025"})).status == 200

    serve(ConsoleState([flow], ledger), check)


def test_read_only_serves_no_action(tmp_path: Path) -> None:
    flow, ledger = queue_with_dead(tmp_path)
    before = error_names(tmp_path)

    async def check(client: TestClient[Any, Any]) -> None:
        h = {"X-CSRF-Token": await csrf(client)}
        body = {"reason": "rejected", "expect": 3, "request_id": "req-00000006"}
        r = await client.post("/api/flows/f/dead/replay", json=body, headers=h)
        assert r.status in (404, 405)
        session = await (await client.get("/api/session")).json()
        flows = await (await client.get("/api/flows")).json()
        assert session["read_only"] is True and flows["flows"]["f"]["actions"] == []
        spec = await (await client.get("/api/openapi.json")).json()
        assert not any("post" in ops for ops in spec["paths"].values())

    serve(ConsoleState([flow], ledger, read_only=True), check)
    assert error_names(tmp_path) == before


def test_every_answer_carries_the_security_headers(tmp_path: Path) -> None:
    flow, ledger = queue_with_dead(tmp_path)

    async def check(client: TestClient[Any, Any]) -> None:
        for path in ("/", "/console.js", "/api/flows", "/api/nope"):
            r = await client.get(path)
            assert "default-src 'self'" in r.headers["Content-Security-Policy"], path
            assert r.headers["X-Content-Type-Options"] == "nosniff"

    serve(ConsoleState([flow], ledger), check)


def test_the_routes_are_the_documents_paths() -> None:
    def template(path: str) -> str:
        return path.replace("{action:replay|purge}", "{action}")

    assert {template(p) for _, p, _, _ in ROUTES} == set(document()["paths"])
    assert {template(p) for _, p, _, changes in ROUTES if not changes} == set(
        document(read_only=True)["paths"]
    )


def test_a_non_local_bind_needs_a_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match="only with a token"):
        check_bind("0.0.0.0", None)
    check_bind("0.0.0.0", TOKEN)
    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    monkeypatch.delenv("ONCEQ_CONSOLE_TOKEN", raising=False)
    assert read_token(None) is None
    monkeypatch.setenv("ONCEQ_CONSOLE_TOKEN", "short")
    with pytest.raises(UsageError, match="shorter than 16"):
        read_token(None)
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    assert read_token(f) == TOKEN
    f.write_text("\n")
    with pytest.raises(UsageError, match="empty"):
        read_token(f)
