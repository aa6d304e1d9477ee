"""The console in a real browser: Playwright driving Debian's Chromium (launched by its
path, nothing downloaded). Failures grouped by reason, a message and its journey, a
group replayed with the counts moving and the partner called once per replayed id, a
purge confirmed, read-only mode, and requests from another origin or without the
token changing nothing. With ONCEQ_SCREENSHOTS=DIR the three views are saved there
(docs/console.md shows the ones made so)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pika
import pytest

import nats_support
from console_support import Served, dead_queue, run_apart, serve
from onceq import Flow, MessageSpec, NatsSource, PythonEffect, RabbitSource, Reject, RetryPolicy
from onceq._console.server import ConsoleThread, url_of
from onceq._console.state import ConsoleState
from onceq.errors import AllFailed
from support import free_port

playwright_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = os.environ.get("ONCEQ_CHROMIUM", "/usr/bin/chromium")
SHOTS = os.environ.get("ONCEQ_SCREENSHOTS")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not shutil.which(CHROMIUM):
        if os.environ.get("CI") == "true":
            pytest.fail(f"no chromium at {CHROMIUM} (.ci/run installs Debian's)")
        pytest.skip(f"no chromium at {CHROMIUM}")
    with playwright_api.sync_playwright() as p:
        # --no-sandbox: the suite runs as root in a container, where Chromium's sandbox
        # cannot start; the page it loads is our own.
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    pg = context.new_page()
    pg.set_default_timeout(15_000)
    yield pg
    context.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    flow, root, ledger = dead_queue(tmp_path)
    yield from serve(flow, root, ledger)


def shot(page: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


def test_failures_grouped_a_message_and_its_journey(page: Any, served: Served) -> None:
    page.goto(served.url + "/#/flows")
    row = page.locator("table.flows tr[data-flow=f]")
    playwright_api.expect(row).to_contain_text("dirq")
    shot(page, "flows")
    page.click("#nav-failures")
    group = page.locator("table.groups tr[data-reason=rejected]")
    playwright_api.expect(group).to_contain_text("4")
    shot(page, "failures")
    group.click()
    playwright_api.expect(page.locator("table.items tbody tr")).to_have_count(4)
    page.click("text=m3.json")
    playwright_api.expect(page.locator("pre.body")).to_contain_text('"n": 3')
    journey = page.locator("section.journey[data-flow=f]")
    playwright_api.expect(journey).to_contain_text("dead")
    playwright_api.expect(journey.locator("tr[data-step=dead]")).to_contain_text("rejected")
    shot(page, "message")
    page.fill("#search-id", "m2")
    page.click("#search button")
    playwright_api.expect(page.locator("section.journey")).to_contain_text("done")


def test_replay_a_group_the_counts_move_and_each_id_is_called_once(
    page: Any, served: Served
) -> None:
    page.goto(served.url + "/#/failures/f/rejected")
    playwright_api.expect(page.locator("table.items tbody tr")).to_have_count(4)
    page.click("button[data-action=replay-all]")
    playwright_api.expect(page.locator("#confirm-text")).to_have_text(
        "Replay 4 dead letter(s) of flow f?"
    )
    page.click("#confirm-ok")
    playwright_api.expect(page.locator("#notice")).to_contain_text("Replayed 4 of 4 (audit #")
    playwright_api.expect(page.locator("table.items tbody tr")).to_have_count(0)
    assert sorted(p.name for p in (served.root / "inbox").iterdir()) == [
        "m1.json", "m3.json", "m5.json", "m7.json"
    ]  # fmt: skip
    # The partner is fixed: the replayed messages go through, each called once.
    calls: Counter[str] = Counter()

    def accept(doc: dict[str, Any]) -> None:
        calls[doc["id"]] += 1

    fixed = Flow("f", served.flow.source, MessageSpec(id_field="id"), effect=PythonEffect(accept))
    run_apart(fixed, served.ledger)
    assert calls == Counter({"m1": 1, "m3": 1, "m5": 1, "m7": 1})
    page.goto(served.url + "/#/flows")
    row = page.locator("table.flows tr[data-flow=f]")
    playwright_api.expect(row.locator("td.processed")).to_have_text("8")  # processed: 4 -> 8
    page.click("#nav-failures")
    playwright_api.expect(page.locator("main")).to_contain_text("No dead letters.")


def test_a_cancelled_confirmation_changes_nothing(page: Any, served: Served) -> None:
    page.goto(served.url + "/#/failures/f/rejected")
    page.check("input[value='m1.json']")
    page.click("button[data-action=replay-selected]")
    playwright_api.expect(page.locator("#confirm-text")).to_have_text(
        "Replay 1 dead letter(s) of flow f?"
    )
    page.click("#confirm-cancel")
    playwright_api.expect(page.locator("#notice")).to_have_text("Nothing done.")
    assert (served.root / "error" / "m1.json").exists()
    assert not list((served.root / "inbox").iterdir())


def test_read_only_has_no_action(page: Any, tmp_path: Path) -> None:
    flow, root, ledger = dead_queue(tmp_path)
    for s in serve(flow, root, ledger, read_only=True):
        page.goto(s.url + "/#/failures/f/rejected")
        playwright_api.expect(page.locator("table.items tbody tr")).to_have_count(4)
        playwright_api.expect(page.locator("#mode")).to_have_text("read-only")
        assert page.locator("button[data-action]").count() == 0


def test_another_origin_and_a_missing_token_change_nothing(
    page: Any, served: Served, tmp_path: Path
) -> None:
    """A page of another origin POSTs to the console (a simple request, and one with the
    CSRF header, which needs a preflight): both refused, error/ unchanged."""
    before = sorted(p.name for p in (served.root / "error").iterdir())
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "index.html").write_text("<!doctype html><title>evil</title>")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "-d", str(evil)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_port(port)
        page.goto(f"http://127.0.0.1:{port}/index.html")
        body = json.dumps({"reason": "rejected", "expect": 4, "request_id": "evil-request-1"})
        results = page.evaluate(
            """async ([url, body]) => {
                const out = [];
                try {
                    const r = await fetch(url, {method: "POST", body: body, mode: "no-cors",
                        headers: {"Content-Type": "text/plain"}});
                    out.push("simple:" + r.type);
                } catch (e) { out.push("simple:blocked"); }
                try {
                    const r = await fetch(url, {method: "POST", body: body,
                        headers: {"Content-Type": "application/json", "X-CSRF-Token": "guess"}});
                    out.push("preflighted:" + r.status);
                } catch (e) { out.push("preflighted:blocked"); }
                return out;
            }""",
            [served.url + "/api/flows/f/dead/replay", body],
        )
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert results[1] == "preflighted:blocked", results
    assert sorted(p.name for p in (served.root / "error").iterdir()) == before


def test_with_a_token_the_page_asks_for_it_and_nothing_changes_without(
    page: Any, tmp_path: Path
) -> None:
    flow, root, ledger = dead_queue(tmp_path)
    token = "console-token-0123456789"
    port = free_port()
    console = ConsoleThread(ConsoleState([flow], ledger), "127.0.0.1", port, token)
    console.start()
    try:
        url = url_of("127.0.0.1", port).rstrip("/")
        page.goto(url + "/#/failures")
        playwright_api.expect(page.locator("#token")).to_be_visible()
        status = page.evaluate(
            """async (url) => (await fetch(url, {method: "POST", body: "{}",
                headers: {"Content-Type": "application/json"}})).status""",
            url + "/api/flows/f/dead/replay",
        )
        assert status == 403
        assert len(list((root / "error").iterdir())) == 4
        page.goto(url + f"/?token={token}#/failures")
        playwright_api.expect(
            page.locator("table.groups tr[data-reason=rejected]")
        ).to_contain_text("4")
        assert "token=" not in page.url  # kept in the tab, out of the address bar
    finally:
        console.close()


def wait_for_port(port: int) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


def reject_all(doc: dict[str, Any]) -> None:
    raise Reject("refused by the test partner")


def test_purge_with_confirmation_on_rabbitmq(page: Any, amqp_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "EAI_AMQP_URL": amqp_url}
    onceq = [sys.executable, "-m", "onceq"]
    subprocess.run([*onceq, "mq", "topology", "--queue", "inv.in"], env=env, check=True,
                   capture_output=True)  # fmt: skip
    files = []
    for i in range(3):
        f = tmp_path / f"inv-{i}.json"
        f.write_text(json.dumps({"invoiceId": f"INV-{i}", "total": i}))
        files.append(str(f))
    publish = ["mq", "publish", *files, "--exchange", "inv", "--routing-key", "inv"]
    subprocess.run([*onceq, *publish, "--id-field", "invoiceId"], env=env, check=True,
                   capture_output=True)  # fmt: skip
    # One more, with a header holding a secret: the console shows its name, never its value.
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        props = pika.BasicProperties(
            message_id="INV-9", delivery_mode=2, headers={"X-Api-Key": "s3cret-header-value"}
        )
        conn.channel().basic_publish("inv", "inv", b'{"invoiceId": "INV-9"}', props)
    finally:
        conn.close()
    flow = Flow(
        "inv",
        RabbitSource("inv.in", url=amqp_url),
        MessageSpec(id_field="invoiceId"),
        effect=PythonEffect(reject_all),
        retry=RetryPolicy.none(),
    )
    ledger = tmp_path / "ledger.db"
    with pytest.raises(AllFailed):  # every message refused: the batch says so (exit 11)
        run_apart(flow, ledger)
    for s in serve(flow, tmp_path, ledger):
        page.goto(s.url + "/#/message/inv/INV-9")
        playwright_api.expect(page.locator("table.props")).to_contain_text("X-Api-Key")
        seen = page.content() + page.evaluate(
            """async () => JSON.stringify([await (await fetch("/api/flows")).json(),
                await (await fetch("/api/flows/inv/dead?key=INV-9")).json()])"""
        )
        password = amqp_url.split("@")[0].rsplit(":", 1)[1]
        assert "s3cret-header-value" not in seen and f":{password}@" not in seen
        page.goto(s.url + "/#/failures/inv/rejected")
        playwright_api.expect(page.locator("table.items tbody tr")).to_have_count(4)
        page.check("input[value='INV-1']")
        page.click("button[data-action=purge-selected]")
        playwright_api.expect(page.locator("#confirm-text")).to_have_text(
            "Purge 1 dead letter(s) of flow inv?"
        )
        page.click("#confirm-ok")
        playwright_api.expect(page.locator("#notice")).to_contain_text("Purged 1 of 1")
        playwright_api.expect(page.locator("table.items tbody tr")).to_have_count(3)
        assert page.locator("tr[data-key='INV-1']").count() == 0
    with __import__("sqlite3").connect(ledger) as db:
        assert db.execute("SELECT op, ids FROM dead_ops").fetchall() == [("purge", '["INV-1"]')]


def apart(fn: Any, *args: Any) -> Any:
    """fn(*args) in a thread of its own: the NATS helpers run their own event loop, and
    Playwright's sync API keeps one running in the test's thread."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result()


@pytest.fixture
def nats_names() -> Iterator[nats_support.Names]:
    """Stream, subject and durable names of one's own on the shared NATS server, as
    nats_support's fixture makes them; the streams deleted apart afterwards."""
    if not nats_support.server_answers():
        msg = f"NATS JetStream is not answering at {nats_support.URL}"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    tag = uuid.uuid4().hex[:10]
    names = nats_support.Names(nats_support.URL, f"T{tag}", f"onceq.test.{tag}", f"d{tag}")
    try:
        yield names
    finally:
        streams = [names.stream, names.dead_stream]
        apart(asyncio.run, nats_support._delete(names.url, streams))


def test_each_flows_depths_show_under_its_source_types_labels(
    page: Any, nats_names: nats_support.Names, tmp_path: Path
) -> None:
    """The depth columns are what each flow's source type labels (the server says so):
    a directory queue's folders and a NATS consumer's pending, ack pending,
    redelivering and dead, side by side; a flow shows "–" under another kind's column."""
    dirq, _root, ledger = dead_queue(tmp_path)
    apart(nats_support.setup, nats_names)
    apart(nats_support.publish, nats_names, [(json.dumps({"id": "n-dead"}).encode(), {})])
    flow = Flow(
        "n",
        NatsSource(nats_names.stream, nats_names.durable, url=nats_names.url),
        MessageSpec(id_field="id"),
        effect=PythonEffect(reject_all),
        retry=RetryPolicy.none(),
    )
    with pytest.raises(AllFailed):  # its one message refused: dead
        run_apart(flow, ledger)
    more = [(json.dumps({"id": f"n-{i}"}).encode(), {}) for i in range(2)]
    apart(nats_support.publish, nats_names, more)
    port = free_port()
    console = ConsoleThread(ConsoleState([dirq, flow], ledger), "127.0.0.1", port, None)
    console.start()
    try:
        page.goto(url_of("127.0.0.1", port).rstrip("/") + "/#/flows")
        nats_row = page.locator("table.flows tr[data-flow=n]")
        playwright_api.expect(nats_row.locator("td[data-depth=pending]")).to_have_text("2")
        playwright_api.expect(nats_row.locator("td[data-depth=ack_pending]")).to_have_text("0")
        playwright_api.expect(nats_row.locator("td[data-depth=redelivering]")).to_have_text("0")
        playwright_api.expect(nats_row.locator("td[data-depth=dead]")).to_have_text("1")
        playwright_api.expect(nats_row.locator("td[data-depth=inbox]")).to_have_text("–")
        dirq_row = page.locator("table.flows tr[data-flow=f]")
        playwright_api.expect(dirq_row.locator("td[data-depth=error]")).to_have_text("4")
        playwright_api.expect(dirq_row.locator("td[data-depth=pending]")).to_have_text("–")
        headers = page.locator("table.flows thead th").all_text_contents()
        for label in ("inbox", "error", "oldest", "pending", "ack pending", "redelivering", "dead"):
            assert headers.count(label) == 1, (label, headers)
        # The row's cells line up under the headers: one cell per column.
        assert nats_row.locator("td").count() == len(headers)
    finally:
        console.close()
