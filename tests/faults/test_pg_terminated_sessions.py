"""PostgreSQL sessions terminated again and again during a consume: onceq's lines only.

pg_terminate_backend on every session of the ledger's database, every ~0.15 s while
`mq consume` works through its claims (connections stay allowed: the sessions come
back at once, as behind a pooler that recycles them). A session terminated inside the
in-flight guard's pipeline made psycopg print its own second error,
`error ignored terminating <psycopg.AsyncPipeline [BAD] at 0x…>`, on stderr;
onceq reports the lost connection itself (`guard-lost`, `ledger-lost`), so that line
is dropped (onceq._core.logs.LIBRARY_NOISE). Every claim is still recorded and called once.
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest
from test_pg_lost_ledger import Run, check_end, publish, recorded

from mq_support import cli, partner, queues, wait_for
from pg_support import ADMIN_URL

pytestmark = [pytest.mark.broker, pytest.mark.pg, pytest.mark.slow]


def _terminate_all(db: str) -> int:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (db,),
        ).fetchone()
    return int(row[0]) if row else 0


def test_terminated_sessions_print_onceqs_lines_and_no_psycopg_noise(
    amqp_url: str, pg_url: str, tmp_path: Path
) -> None:
    n = 600
    guids = [f"ts-{i:04d}" for i in range(n)]
    assert cli(amqp_url, "mq", "topology").returncode == 0
    publish(amqp_url, tmp_path / "c", guids)
    db = pg_url.rsplit("/", 1)[1]
    terminated = 0
    with partner(0.01) as p:
        run = Run(amqp_url, p.url, pg_url, tmp_path, 1)
        try:
            wait_for(lambda: recorded(pg_url) >= 20, 60, step=0.01)
            deadline = time.monotonic() + 60
            while recorded(pg_url) < n and time.monotonic() < deadline:
                terminated += _terminate_all(db)
                time.sleep(0.15)
            wait_for(lambda: recorded(pg_url) == n, 60)
            wait_for(lambda: all(v == (0, 0) for v in queues(amqp_url, exact=True).values()), 60)
            outs, errs = run.stop()
        finally:
            run.close()
        calls = p.stats()["by_guid"]
    assert terminated >= 5, terminated  # the sessions were cut many times
    check_end(pg_url, guids, calls, amqp_url)
    assert outs[0]["processed"] == n
    (err,) = errs
    assert "connection lost" in err, err  # onceq's own line says it
    for noise in ("AsyncPipeline", "psycopg", " at 0x", "Task exception was never retrieved"):
        assert noise not in err, err
