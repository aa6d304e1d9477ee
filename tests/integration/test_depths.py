"""onceq._sources.amqp.depths against the real broker: every figure checked against the broker's
own count (rabbitmqctl list_queues, read by the test), with messages held unacked by a
consumer of the test's own.

The management API publishes queue statistics every 5 s (collect_statistics_interval),
so `unacked` is waited for (wait_for), never slept for; ready and consumers are live.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import pika
import pytest

from depth_support import Holder, truth
from mq_support import cli, ctl, vhost, wait_for
from onceq._sources.amqp.depths import DepthCache, QueueDepth, management_api, read_depths
from onceq.errors import BrokerUnavailable
from support import free_port, http_server

pytestmark = pytest.mark.broker

QUEUES = ["claim.in", "claim.retry.5s", "claim.dead", "no.such.queue"]


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EAI_RABBITMQ_API", raising=False)


@pytest.fixture
def loaded(amqp_url: str) -> Iterator[str]:
    """The claims topology; 5 in claim.in of which 2 held unacked, 2 in claim.dead, a
    second (idle) consumer on claim.dead."""
    assert cli(amqp_url, "mq", "topology").returncode == 0
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    for i in range(5):
        ch.basic_publish("eai.claim", "claim", b"{}", pika.BasicProperties(message_id=str(i)))
    for _ in range(2):
        ch.basic_publish("eai.dlx", "claim.dead", b"{}")
    holder = Holder(amqp_url, "claim.in", prefetch=2)
    holder.take(2)
    idle = Holder(amqp_url, "claim.dead", prefetch=1)
    idle.ch.basic_cancel(idle.ch.consumer_tags[0])  # a consumer that came and went…
    idle.ch.basic_consume("claim.retry.5s", lambda *_: None)  # …and one that stays
    try:
        yield amqp_url
    finally:
        holder.close()
        idle.close()
        conn.close()


def read(url: str, api: object = "default", queues: list[str] = QUEUES) -> dict:
    chosen = management_api(url) if api == "default" else api
    return asyncio.run(read_depths(url, queues, api=chosen))  # type: ignore[arg-type]


def test_depths_are_the_brokers_own_figures(loaded: str) -> None:
    expected = truth(loaded)
    assert expected["claim.in"] == QueueDepth(ready=3, consumers=1, unacked=2)  # the setup
    assert expected["claim.retry.5s"].consumers == 1
    want = {q: expected.get(q) for q in QUEUES}
    got: dict = {}

    def same() -> bool:  # unacked comes from the API's statistics, up to 5 s old
        got.update(read(loaded))
        return got == want

    wait_for(same, 20, step=0.5)
    assert got["no.such.queue"] is None


def test_ready_and_consumers_are_live_without_waiting_for_statistics(loaded: str) -> None:
    got = read(loaded, api=None)
    assert got["claim.in"] == QueueDepth(ready=3, consumers=1, unacked=None)
    assert got["claim.dead"] == QueueDepth(ready=2, consumers=0, unacked=None)
    assert got["no.such.queue"] is None


def test_a_missing_queue_first_does_not_blank_the_ones_after_it(loaded: str) -> None:
    # The 404 closes the channel: the next queue is read on a fresh one.
    got = read(loaded, api=None, queues=["no.such.queue", "nor.this", "claim.dead"])
    assert got == {"no.such.queue": None, "nor.this": None, "claim.dead": QueueDepth(2, 0, None)}


def test_a_missing_vhost_is_broker_unavailable(amqp_url: str) -> None:
    with pytest.raises(BrokerUnavailable, match="does not exist") as caught:
        read(amqp_url + "-gone")
    assert caught.value.exit_code == 7


def test_the_api_off_blanks_unacked_only(loaded: str, caplog: pytest.LogCaptureFixture) -> None:
    api = management_api(loaded, f"http://127.0.0.1:{free_port()}")  # nothing listens there
    with caplog.at_level(logging.WARNING):
        got = read(loaded, api)
        again = read(loaded, api)
    assert got["claim.in"] == QueueDepth(ready=3, consumers=1, unacked=None)
    assert got["claim.dead"] == QueueDepth(ready=2, consumers=0, unacked=None)
    assert again == got
    assert api is not None and api.available is False and "cannot connect" in (api.error or "")
    assert len([r for r in caplog.records if "management API" in r.getMessage()]) == 1


def test_a_wrong_api_password_blanks_unacked_and_never_shows(
    loaded: str, caplog: pytest.LogCaptureFixture
) -> None:
    api = management_api(loaded, "http://guest:wrongPW5678@127.0.0.1:15672")
    with caplog.at_level(logging.DEBUG):
        got = read(loaded, api)
    assert got["claim.in"] == QueueDepth(ready=3, consumers=1, unacked=None)
    assert api is not None and api.available is False and "401" in (api.error or "")
    shown = caplog.text + repr(api) + json.dumps(api.as_dict())
    assert "login refused" in shown and "wrongPW5678" not in shown


@pytest.fixture
def monitor(amqp_url: str) -> Iterator[tuple[str, str]]:
    """A broker user of the test's own with the monitoring tag: (name, password)."""
    name, password = f"onceq-mon-{uuid.uuid4().hex[:8]}", f"mon{uuid.uuid4().hex[:10]}"
    ctl("add_user", name, password)
    try:
        ctl("set_user_tags", name, "monitoring")
        ctl("set_permissions", "-p", vhost(amqp_url), name, ".*", ".*", ".*")
        yield name, password
    finally:
        ctl("delete_user", name)


def test_the_overrides_own_login_is_used(loaded: str, monitor: tuple[str, str]) -> None:
    """The AMQP URL logs in as guest; the API as the override's user. With the monitor's
    name and a wrong password it is refused, so its own login is what was sent."""
    name, password = monitor
    right = management_api(loaded, f"http://{name}:{password}@127.0.0.1:15672")
    wait_for(lambda: read(loaded, right)["claim.in"] == QueueDepth(3, 1, 2), 20, step=0.5)
    assert right is not None and right.available is True and right.error is None
    wrong = management_api(loaded, f"http://{name}:not-{password}@127.0.0.1:15672")
    assert read(loaded, wrong)["claim.in"] == QueueDepth(3, 1, None)
    assert wrong is not None and wrong.available is False
    assert password not in right.url + wrong.url + str(wrong.error)


def test_the_cache_refreshes_and_reads_once_per_period(loaded: str) -> None:
    async def scenario() -> tuple[int, int, float]:
        cache = DepthCache(loaded, ["claim.in", "claim.dead"], management_api(loaded), every=0.5)
        assert cache.snapshot() == {} and cache.updated is None
        stop = asyncio.Event()
        task = asyncio.create_task(cache.run(stop))
        while cache.updated is None:
            await asyncio.sleep(0.01)
        assert cache.snapshot()["claim.dead"].ready == 2  # type: ignore[union-attr]
        # A publish is seen within a period or two, on the cache's own connection.
        conn = pika.BlockingConnection(pika.URLParameters(loaded))
        conn.channel().basic_publish("eai.dlx", "claim.dead", b"{}")
        conn.close()
        start = asyncio.get_running_loop().time()
        while cache.snapshot()["claim.dead"].ready != 3:  # type: ignore[union-attr]
            assert asyncio.get_running_loop().time() - start < 5, cache.snapshot()
            await asyncio.sleep(0.01)
        # Scrapes as fast as the loop can run them for 2 s: reads stay one per period.
        before, scrapes = cache.reads, 0
        t0 = asyncio.get_running_loop().time()
        while asyncio.get_running_loop().time() - t0 < 2.0:
            for _ in range(100):
                cache.snapshot()
                scrapes += 1
            await asyncio.sleep(0)
        reads = cache.reads - before
        stop.set()
        await asyncio.wait_for(task, 5)
        assert cache.error is None
        return reads, scrapes, cache.every

    reads, scrapes, every = asyncio.run(scenario())
    assert scrapes > 10_000
    assert 2.0 / every - 1 <= reads <= 2.0 / every + 1, reads


def test_the_cache_keeps_the_failure_and_never_raises(amqp_url: str) -> None:
    async def scenario() -> DepthCache:
        cache = DepthCache(amqp_url + "-gone", ["claim.in"], None, every=0.05)
        stop = asyncio.Event()
        task = asyncio.create_task(cache.run(stop))
        while cache.reads < 3:
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, 5)
        return cache

    cache = asyncio.run(scenario())
    assert cache.updated is None and cache.snapshot() == {}
    assert "does not exist" in (cache.error or "") and "guest:guest" not in (cache.error or "")


class _NotTheApi(http.server.BaseHTTPRequestHandler):
    """A web server that is not RabbitMQ's: a page for /html paths, 404 for the rest."""

    def do_GET(self) -> None:
        page = self.path.startswith("/html")
        self.send_response(200 if page else 404)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html>hello</html>")

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def other_web_server() -> Iterator[str]:
    with http_server(_NotTheApi) as url:
        yield url


@pytest.mark.parametrize("path", ["/html", "/nothing"])
def test_another_web_server_is_not_taken_for_the_api(
    loaded: str, other_web_server: str, path: str
) -> None:
    api = management_api(loaded, other_web_server + path)
    got = read(loaded, api)
    assert got["claim.in"] == QueueDepth(ready=3, consumers=1, unacked=None)
    assert api is not None and api.available is False
    assert "not a RabbitMQ management API" in (api.error or "")


def test_the_cache_reconnects_after_the_broker_drops_its_connection(amqp_url: str) -> None:
    assert cli(amqp_url, "mq", "topology", "--retry", "exercise").returncode == 0

    async def scenario() -> tuple[str | None, int]:
        cache = DepthCache(amqp_url, ["claim.in"], None, every=0.2)
        stop = asyncio.Event()
        task = asyncio.create_task(cache.run(stop))
        while cache.updated is None:
            await asyncio.sleep(0.01)
        first = cache._reader.connection  # type: ignore[union-attr]
        # The broker closes every connection of the vhost (as a restart would).
        await asyncio.to_thread(ctl, "close_all_connections", "-p", vhost(amqp_url), "test")
        conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
        conn.channel().basic_publish("eai.claim", "claim", b"{}")
        conn.close()
        seen_error = None
        start = asyncio.get_running_loop().time()
        while (cache.snapshot()["claim.in"] or QueueDepth(0, 0, None)).ready != 1:
            seen_error = seen_error or cache.error
            assert asyncio.get_running_loop().time() - start < 10, (cache.error, cache.snapshot())
            await asyncio.sleep(0.01)
        assert first.is_closed and cache._reader.connection is not first  # type: ignore[union-attr]
        stop.set()
        await asyncio.wait_for(task, 5)
        return seen_error, cache.reads

    error, reads = asyncio.run(scenario())
    assert reads >= 2
    assert error is None or "guest:guest" not in error  # a failed period, masked


@pytest.fixture
def odd_vhost() -> Iterator[str]:
    """A vhost whose name holds a slash, a space and a percent sign: the API's path must
    carry it as one quoted segment."""
    name = f"onceq-test-{uuid.uuid4().hex[:6]}/a b%"
    ctl("add_vhost", name)
    try:
        ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        yield f"amqp://guest:guest@127.0.0.1:5672/{quote(name, safe='')}"
    finally:
        ctl("delete_vhost", name)


def test_a_vhost_with_a_slash_space_and_percent_reads_unacked_too(odd_vhost: str) -> None:
    assert cli(odd_vhost, "mq", "topology", "--retry", "exercise").returncode == 0
    conn = pika.BlockingConnection(pika.URLParameters(odd_vhost))
    for _ in range(2):
        conn.channel().basic_publish("eai.claim", "claim", b"{}")
    holder = Holder(odd_vhost, "claim.in", prefetch=1)
    holder.take(1)
    try:
        want = QueueDepth(ready=1, consumers=1, unacked=1)
        assert truth(odd_vhost)["claim.in"] == want
        wait_for(lambda: read(odd_vhost, queues=["claim.in"])["claim.in"] == want, 20, step=0.5)
    finally:
        holder.close()
        conn.close()
