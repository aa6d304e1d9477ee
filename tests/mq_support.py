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
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from support import SAMPLE, free_port, run_cli

CLAIMS = SAMPLE / "claims"


def vhost(url: str) -> str:
    return unquote(urlsplit(url).path[1:]) or "/"


def ctl(*args: str) -> str:
    done = subprocess.run(
        ["rabbitmqctl", "-q", *args], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout


def queues(url: str) -> dict[str, tuple[int, int]]:
    """{queue: (messages ready+unacked, unacked)} read from the broker itself."""
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
    arguments) and bindings, read with rabbitmqctl: what a refused command must not change."""
    v = vhost(url)
    exchanges = json.loads(
        ctl("list_exchanges", "-p", v, "name", "type", "durable", "--formatter", "json")
    )
    qs = json.loads(
        ctl("list_queues", "-p", v, "name", "durable", "arguments", "--formatter", "json")
    )
    bindings = json.loads(
        ctl("list_bindings", "-p", v, "source_name", "destination_name", "routing_key",
            "--formatter", "json")
    )  # fmt: skip
    return {
        "exchanges": sorted(
            (e["name"], e["type"], e["durable"])
            for e in exchanges
            if e["name"] and not e["name"].startswith("amq.")
        ),
        "queues": sorted(
            (q["name"], q["durable"], tuple(sorted((a[0], a[2]) for a in q["arguments"])))
            for q in qs
        ),
        "bindings": sorted(
            (b["source_name"], b["destination_name"], b["routing_key"])
            for b in bindings
            if b["source_name"]
        ),
    }


def cli(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env={"EAI_AMQP_URL": url, **env}, timeout=120)


def topology(url: str) -> None:
    r = cli(url, "mq", "topology")
    assert r.returncode == 0, r.stderr


def publish(url: str, *files: Path) -> None:
    r = cli(url, "mq", "publish", *map(str, files))
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


def consume(url: str, claim: str, db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`onceq mq consume … --json` to completion; returns the process (stdout is JSON)."""
    return cli(url, "mq", "consume", "--claim", claim, "--db", str(db), "--json", *args)


def start_consumer(
    url: str, claim: str, db: Path | None, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """`onceq mq consume --claim CLAIM [--db DB] --json ARGS` as a process of its own."""
    where = [] if db is None else ["--db", str(db)]
    return subprocess.Popen(
        [sys.executable, "-m", "onceq", "mq", "consume", "--claim", claim, *where, "--json",
         *args],
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
    out = ctl("list_queues", "-p", vhost(url), "name", "consumers", "--formatter", "json")
    return next((int(q["consumers"]) for q in json.loads(out or "[]") if q["name"] == queue), 0)


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
) -> subprocess.CompletedProcess[str]:
    """`onceq mq consume … --json` until `until()` holds, then a graceful SIGTERM.

    Instead of --max-seconds: a run cut by the clock passes or fails with the load of
    the machine; this one ends when the state the test waits for is there.
    """
    proc = start_consumer(url, claim, db, *args, env=env)
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
