"""Helpers for the `onceq mq dead` tests: dead letters made the real way, and what is where.

Dead letters are made by a real consumer over the real claim stub: a claim without
docs dies at its first call (422), a BUSY claim after two (503, the exercise's rule).
The consumer runs in-process with the exercise's policy set on the flow, so its
ledger rows are the ones `mq consume` writes, whatever the CLI's default policy.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from cli_support import invoke
from mq_support import claim_doc, get_all, publish, queues, write_claims


def run_dead(
    url: str, *args: str, cwd: Path | None = None, stdin: Any = subprocess.DEVNULL
) -> subprocess.CompletedProcess[str]:
    """`onceq mq dead ARGS` as a user runs it; no terminal on stdin unless given one.

    With no stdin given it runs in this process (cli_support.invoke: same entry point,
    streams and exit codes, 0.5 s of CPU less than a child); a terminal needs a child.
    """
    if stdin is subprocess.DEVNULL:
        return invoke("mq", "dead", *args, env={"EAI_AMQP_URL": url}, cwd=cwd)
    return subprocess.run(
        [sys.executable, "-m", "onceq", "mq", "dead", *args],
        capture_output=True,
        text=True,
        stdin=stdin,
        env={**os.environ, "EAI_AMQP_URL": url},
        cwd=cwd,
        timeout=180,
    )


def consume_exercise(url: str, claim: str, db: Path, prefetch: int = 20) -> Any:
    """One `mq consume --claim CLAIM --until-empty` run with the exercise's rule
    (one immediate retry, then dead; no breaker), in this process."""
    from onceq._core.retry import BreakerPolicy, RetryPolicy
    from onceq._exercise.claims import claims_flow
    from onceq._flows.batch import run_report

    flow = claims_flow(claim, url=url, prefetch=prefetch)
    flow.retry = RetryPolicy.exercise()
    flow.breaker = BreakerPolicy.off()
    report = run_report([flow], db, until_empty=True)
    assert report.drained[flow.name], report.as_dict()
    return report


def make_dead(url: str, folder: Path, claim: str, db: Path, docs: list[dict[str, Any]]) -> None:
    """Publish `docs` as claims and consume them; the failing ones end in claim.dead."""
    publish(url, *write_claims(folder, docs))
    consume_exercise(url, claim, db)


def rejected(guid: str) -> dict[str, Any]:
    return claim_doc(guid, docs=[])  # 422 at the first call


def busy(guid: str) -> dict[str, Any]:
    return claim_doc(guid, claim_id=f"BUSY-{guid}")  # 503 every time


def ids_in(url: str, queue: str) -> list[str]:
    """The message_ids of `queue`, head first (browsed with pika; all requeued)."""
    return [p.message_id for _m, p, _b in get_all(url, queue)]


def foreign_dead_letter(
    url: str,
    guid: str | None,
    body: bytes | None = None,
    *,
    exchange: str = "eai.dlx",
    key: str = "claim.dead",
    headers: dict[str, Any] | None = None,
) -> None:
    """A message put into a dead-letter queue by hand (default claim.dead through
    eai.dlx): no ledger row, no x-death; no message_id property when guid is None."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish(
            exchange,
            key,
            body if body is not None else json.dumps(claim_doc(str(guid))).encode(),
            pika.BasicProperties(message_id=guid, delivery_mode=2, headers=headers),
            mandatory=True,
        )
    finally:
        conn.close()


def table(db: Path, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def ledger_dump(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table: what a command that changes nothing leaves as it was."""
    names = [r[0] for r in table(db, "SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {n: table(db, f'SELECT * FROM "{n}"') for n in sorted(names)}


def depth(url: str) -> dict[str, tuple[int, int]]:
    """(messages, unacked) of claim.in and claim.dead (retry tiers, if declared, apart)."""
    return {q: v for q, v in queues(url).items() if q in ("claim.in", "claim.dead")}
