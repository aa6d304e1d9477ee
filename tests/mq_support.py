"""Helpers for the RabbitMQ tests: the real broker, the real stub, the real CLI."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pika
import pika.exceptions

from cli_support import invoke
from support import SAMPLE, free_port, management, run_cli

CLAIMS = SAMPLE / "claims"


def vhost(url: str) -> str:
    return unquote(urlsplit(url).path[1:]) or "/"


def ctl(*args: str) -> str:
    done = subprocess.run(
        ["rabbitmqctl", "-q", *args], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout


def _vhost_path(url: str) -> str:
    return urllib.parse.quote(vhost(url), safe="")


def _declared(url: str) -> dict[str, tuple[int, int]]:
    """{queue: (ready, consumers)}, each from a passive queue.declare: answered by the
    queue itself, so exact at the moment of the call (the management API's message
    counts are statistics, up to 5 s old). The names are the vhost's metadata
    (`disable_stats`: read from the broker's database, not from statistics)."""
    names = [
        q["name"] for q in management("GET", f"/api/queues/{_vhost_path(url)}?disable_stats=true")
    ]
    out: dict[str, tuple[int, int]] = {}
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        for name in names:
            ch = conn.channel()
            try:
                ok = ch.queue_declare(name, passive=True).method
            except pika.exceptions.ChannelClosedByBroker:
                continue  # deleted since the listing
            out[name] = (ok.message_count, ok.consumer_count)
            ch.close()
    finally:
        conn.close()
    return out


def queues(url: str, exact: bool = False) -> dict[str, tuple[int, int]]:
    """{queue: (messages ready+unacked, unacked)} read from the broker itself.

    Fast and exact while no consumer is registered on any of the vhost's queues: the
    queue process that answers the passive declare has then handled every channel's
    end, and requeued what each held (a channel's end and the requeue of its unacked
    messages are one step of the queue; a closed connection's channels end before its
    close-ok), so unacked is 0. With a consumer on any queue, or `exact` (the kill -9
    tests: a killed process's basic.get messages stay unacked, with no consumer,
    until the broker notices the dead socket), rabbitmqctl counts unacked itself:
    an Erlang VM per call (0.8 s of CPU), which is why it is not the default.
    """
    if not exact:
        declared = _declared(url)
        if all(consumers == 0 for _ready, consumers in declared.values()):
            return {name: (ready, 0) for name, (ready, _c) in declared.items()}
    out = ctl(
        "list_queues", "-p", vhost(url), "name", "messages", "messages_unacknowledged",
        "--formatter", "json",
    )  # fmt: skip
    return {
        r["name"]: (int(r["messages"]), int(r["messages_unacknowledged"]))
        for r in json.loads(out or "[]")
    }


def broker_state(url: str) -> dict[str, object]:
    """The vhost's own exchanges (not the built-in amq.* ones), its queues (durable,
    arguments) and bindings, read from the management API's metadata (the broker's
    database, not its statistics): what a refused command must not change."""
    v = _vhost_path(url)
    exchanges = management("GET", f"/api/exchanges/{v}?disable_stats=true")
    qs = management("GET", f"/api/queues/{v}?disable_stats=true")
    bindings = management("GET", f"/api/bindings/{v}")
    return {
        "exchanges": sorted(
            (e["name"], e["type"], e["durable"])
            for e in exchanges
            if e["name"] and not e["name"].startswith("amq.")
        ),
        "queues": sorted(
            (q["name"], q["durable"], tuple(sorted(q["arguments"].items()))) for q in qs
        ),
        "bindings": sorted(
            (b["source"], b["destination"], b["routing_key"]) for b in bindings if b["source"]
        ),
    }


def cli(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env={"EAI_AMQP_URL": url, **env}, timeout=120)


def topology(url: str) -> None:
    """The exercise's six objects (`--retry exercise`: no retry queue), for the tests of
    the exercise's rule, whose consumers the helpers below run with EXERCISE."""
    # In this process (a child costs 0.5 s of CPU): the objects are what is tested here,
    # not the command, whose own tests (test_mq_topology.py) run it as a user would.
    r = invoke("mq", "topology", "--retry", "exercise", env={"EAI_AMQP_URL": url})
    assert r.returncode == 0, r.stderr


def publish(url: str, *files: Path) -> None:
    r = invoke("mq", "publish", *map(str, files), env={"EAI_AMQP_URL": url})  # as topology()
    assert r.returncode == 0, r.stderr


def claim_doc(guid: str, claim_id: str | None = None, docs: list[str] | None = None) -> dict:
    return {
        "guid": guid,
        "claimId": claim_id or f"CL-{guid}",
        "amount": 1000,
        "docs": ["receipt.pdf"] if docs is None else docs,
    }


def write_claims(folder: Path, docs: list[dict[str, Any]]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, doc in enumerate(docs):
        p = folder / f"c{i:05d}.json"
        p.write_text(json.dumps(doc))
        paths.append(p)
    return paths


def get_all(url: str, queue: str) -> list[tuple[Any, Any, bytes]]:
    """basic_get every message of `queue` (then requeue them): (method, properties, body)."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        out = []
        while True:
            method, props, body = ch.basic_get(queue, auto_ack=False)
            if method is None:
                break
            out.append((method, props, body))
        return out  # closing the connection returns the unacked messages
    finally:
        conn.close()


def post(url: str, body: bytes, key: str | None = None) -> tuple[int, dict[str, Any]]:
    """POST a JSON body to a stub with Idempotency-Key `key` (none when None).

    (status, the stub's JSON answer); an error status is returned, not raised.
    """
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    req = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        return exc.code, json.loads(raw) if raw.startswith(b"{") else {}


class Partner:
    """A partner stub as a real subprocess (`python -m onceq partner KIND`).

    kind: "claim" (the claim system, ids counted by_guid) or "invoices" (the invoice
    partner, ids counted by_id). args: more options, e.g. ("--down-for", "12",
    "--down-as", "refuse") for an outage from its start.
    """

    def __init__(self, delay: float = 0.0, kind: str = "claim", args: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.id_stat = "by_guid" if kind == "claim" else "by_id"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "onceq", "partner", kind, "--port", str(self.port),
             "--delay", str(delay), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        assert f"http://127.0.0.1:{self.port}" in line, (line, self.proc.stderr.read())  # type: ignore[union-attr]

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/_stats", timeout=5) as r:
            return json.loads(r.read())

    def _post(self, path: str) -> dict[str, Any]:
        req = urllib.request.Request(f"{self.url}{path}", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())

    def hold(self) -> None:
        """From now on every claim call waits at the stub (counted) until released."""
        self._post("/_hold")

    def release(self, n: int | None = None) -> int:
        """Answer the n oldest held calls; all of them (and stop holding) without n."""
        return int(self._post("/_release" if n is None else f"/_release?n={n}")["released"])

    def held(self) -> int:
        return int(self.stats()["held"])

    def outage(self, mode: str, seconds: float, retry_after: int | None = None) -> dict[str, Any]:
        """Down from now for `seconds` (refuse | 503 | hang), then back by itself."""
        extra = "" if retry_after is None else f"&retry_after={retry_after}"
        return self._post(f"/_outage?mode={mode}&seconds={seconds}{extra}")

    def check_keys(self) -> dict[str, Any]:
        """Every call carried Idempotency-Key == the body's id (the message_id)."""
        stats = self.stats()
        assert stats["key_missing"] == 0 and stats["key_mismatch"] == 0, stats
        assert stats["by_key"] == stats[self.id_stat], stats
        return stats

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=10)


@contextmanager
def partner(
    delay: float = 0.0, *, keys: bool = True, kind: str = "claim", args: Sequence[str] = ()
) -> Iterator[Partner]:
    """The stub for the block's duration.

    keys: on leaving the block normally, assert that every call the stub saw carried
    Idempotency-Key == the body's id. On by default, so every consume test checks
    the header the claim system deduplicates by; only a test that posts by hand
    turns it off. kind: which stub ("claim" or "invoices").
    """
    p = Partner(delay, kind, args)
    try:
        yield p
        if keys and p.proc.poll() is None:
            p.check_keys()
    finally:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait()


# The exercise's rule (seed 001: a transient failure is requeued once, then dead; no
# circuit breaker), what the lab's consumer.py runs. The consume helpers pass it, so
# the tests written for that rule keep testing it exactly; a test of the default
# policy (delayed retries, the breaker) passes policy=() and its own flags. The
# policy comes before ARGS: a flag given there wins.
EXERCISE = ("--retry", "exercise", "--no-breaker")


def consume(
    url: str, claim: str, db: Path, *args: str, policy: Sequence[str] = EXERCISE
) -> subprocess.CompletedProcess[str]:
    """`onceq mq consume … --json` to completion; returns the process (stdout is JSON)."""
    return cli(url, "mq", "consume", "--claim", claim, "--db", str(db), "--json", *policy, *args)


def start_consumer(
    url: str,
    claim: str,
    db: Path | None,
    *args: str,
    env: dict[str, str] | None = None,
    policy: Sequence[str] = EXERCISE,
) -> subprocess.Popen[str]:
    """`onceq mq consume --claim CLAIM [--db DB] --json POLICY ARGS` as a process of its own."""
    where = [] if db is None else ["--db", str(db)]
    return subprocess.Popen(
        [sys.executable, "-m", "onceq", "mq", "consume", "--claim", claim, *where, "--json",
         *policy, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "EAI_AMQP_URL": url, **(env or {})},
    )  # fmt: skip


def wait_for(predicate: Callable[[], bool], timeout: float, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(step)


def consumers(url: str, queue: str = "claim.in") -> int:
    """How many consumers the broker has registered on `queue` (0 once they cancelled)."""
    return _declared(url).get(queue, (0, 0))[1]


def consumer_prefetch(url: str) -> list[int]:
    """The prefetch_count of every consumer in the vhost, as the broker enforces it."""
    out = ctl("list_consumers", "-p", vhost(url), "prefetch_count", "--formatter", "json")
    return [int(c["prefetch_count"]) for c in json.loads(out or "[]")]


def count(db: Path, table: str) -> int:
    """Rows in a ledger table, read-only; 0 while the consumer has not created it yet.

    Read-only (mode=ro), so that polling never creates the ledger file itself.
    """
    if not db.exists():
        return 0
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    except sqlite3.OperationalError:  # the schema is being created right now
        return 0
    finally:
        conn.close()


def consume_until(
    url: str,
    claim: str,
    db: Path | None,
    until: Callable[[], bool],
    *args: str,
    timeout: float = 60,
    env: dict[str, str] | None = None,
    policy: Sequence[str] = EXERCISE,
) -> subprocess.CompletedProcess[str]:
    """`onceq mq consume … --json` until `until()` holds, then a graceful SIGTERM.

    Instead of --max-seconds: a run cut by the clock passes or fails with the load of
    the machine; this one ends when the state the test waits for is there.
    """
    proc = start_consumer(url, claim, db, *args, env=env, policy=policy)
    try:
        wait_for(until, timeout)
    except BaseException:
        proc.kill()
        _, err = proc.communicate(timeout=60)
        raise AssertionError(f"the consumer never reached the state; its stderr: {err}") from None
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def rows(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()
