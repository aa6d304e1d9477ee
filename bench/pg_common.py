"""PostgreSQL for the benchmarks (bench/pg_ledger.py, bench/scale.py).

Each run gets a database of its own (`temp_database`: CREATE DATABASE, then DROP …
WITH (FORCE) afterwards), on the server named by ONCEQ_BENCH_PG (default
postgresql://postgres@127.0.0.1:5432/postgres: the loopback server with trust
authentication that .ci/run starts). The ledger is read back over one connection per
database that is kept open (`ledger_count` is polled every few milliseconds: a new
connection per poll would fork a backend each time and bill PostgreSQL for the
bench's own work).

The evidence is the same as for SQLite (mq_common.ledger_count / ledger_span): the
presets' `processed` table, which on PostgreSQL lands in onceq's schema, and its
`processed_at` stamps, one per commit.
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

ADMIN_URL = os.environ.get("ONCEQ_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
SCHEMA = "onceq"  # where PgLedger keeps its tables (and the presets' `processed`)

_readers: dict[str, Any] = {}


def is_pg(target: object) -> bool:
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def _admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql)


def require_pg() -> None:
    import psycopg

    try:
        _admin("SELECT 1")
    except psycopg.Error as exc:
        sys.exit(f"bench: PostgreSQL does not answer at {_host()}: {exc}")


def _host() -> str:
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(ADMIN_URL)
    return f"{info.get('host', '?')}:{info.get('port', 5432)}"


def server() -> str:
    """One line naming the server and the settings that bear on a commit's cost."""
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=10) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        settings = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
            for name in ("synchronous_commit", "fsync", "wal_sync_method", "shared_buffers")
        }
    shown = ", ".join(f"{k} {v}" for k, v in settings.items())
    return f"PostgreSQL {version} on {_host()} (loopback); {shown}"


@contextlib.contextmanager
def temp_database(label: str) -> Iterator[str]:
    """A new empty database; yields its URL; dropped (sessions and all) afterwards."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    name = f"onceq_bench_{label}_{uuid.uuid4().hex[:8]}"
    _admin(f'CREATE DATABASE "{name}"')
    info = conninfo_to_dict(ADMIN_URL)
    url = "postgresql://{user}@{host}:{port}/{name}".format(
        user=info.get("user", "postgres"),
        host=info.get("host", "127.0.0.1"),
        port=info.get("port", 5432),
        name=name,
    )
    if info.get("password"):  # keep the admin URL's password (never printed)
        url = make_conninfo(url, password=info["password"])
    try:
        yield url
    finally:
        reader = _readers.pop(url, None)
        if reader is not None:
            reader.close()
        # FORCE: a consumer the bench stopped may still have a session closing.
        _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _reader(url: str) -> Any:
    import psycopg

    conn = _readers.get(url)
    if conn is None or conn.closed:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
        conn.execute(f"SET search_path = {SCHEMA}, public")
        _readers[url] = conn
    return conn


def ledger_count(url: str, table: str = "processed") -> int:
    """Rows in onceq's `table` (0 while the schema is not there yet)."""
    import psycopg

    try:
        return int(_reader(url).execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    except psycopg.errors.UndefinedTable:
        return 0


def stamps(url: str, column: str = "processed_at", table: str = "processed") -> list[datetime]:
    """The commit stamps of every row (text in ISO 8601, or a timestamp column)."""
    rows = _reader(url).execute(f"SELECT {column} FROM {table}").fetchall()
    return [r[0] if isinstance(r[0], datetime) else datetime.fromisoformat(r[0]) for r in rows]


def groups(db: str | Path) -> int:
    """Group commits that wrote the presets' `processed` rows: one commit stamp each
    (a group's rows share its `now`), in an SQLite file or a PostgreSQL database."""
    sql = "SELECT count(DISTINCT processed_at) FROM processed"
    if is_pg(db):
        return int(_reader(str(db)).execute(sql).fetchone()[0])
    import sqlite3

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(conn.execute(sql).fetchone()[0])
    finally:
        conn.close()


def sessions(url: str) -> dict[str, int]:
    """onceq's sessions on this database by application_name (the bench's reader apart)."""
    rows = _reader(url).execute(
        "SELECT application_name, count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " GROUP BY application_name"
    )
    return {str(name): int(n) for name, n in rows.fetchall()}


def server_pids(url: str) -> list[int]:
    """The server's processes that work for the ledger at `url`: its database's backends
    (the bench's own reader apart), the shared background processes (walwriter,
    checkpointer, background writer, autovacuum …) and the postmaster.

    Backends of other databases are left out: on a machine that runs other things
    against the same server they are not the ledger's cost. A backend lives as long as
    its connection: read these while the consumers are connected (their CPU goes with
    them when they disconnect).
    """
    rows = _reader(url).execute(
        "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
        " AND (datname = current_database() OR backend_type <> 'client backend')"
    )
    pids = [int(pid) for (pid,) in rows.fetchall()]
    own = int(_reader(url).execute("SELECT pg_backend_pid()").fetchone()[0])
    try:  # the postmaster: the parent of every backend (it forks them)
        status = Path(f"/proc/{own}/status").read_text()
        pids.append(int(status.split("PPid:", 1)[1].split()[0]))
    except (OSError, IndexError, ValueError):
        pass
    return pids


def server_cpu(url: str) -> dict[int, float]:
    """CPU seconds (user + system) of each of `server_pids(url)` now."""
    from mq_common import process_cpu  # mq_common imports this module

    return {pid: process_cpu(pid) for pid in server_pids(url)}


def flights(url: str) -> tuple[int, int]:
    """TCP data segments (client → server, server → client) of the database's sessions
    (the bench's reader apart), from the kernel's counters of each server-side socket
    (`ss -ti`: data_segs_in, data_segs_out), read while the sessions are alive.

    The server answers a pipeline at its Sync or Flush, a simple query at its end, so
    its segments out are about its round trips (a Flush right behind a Sync, an answer
    bigger than a segment: a few more); the client's segments in are its sends (psycopg
    may send a pipeline's statements in several). Counted from outside the consumer:
    no tracing in the process under test.
    """
    import subprocess

    rows = _reader(url).execute(
        "SELECT client_port FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
        " AND datname = current_database() AND client_port IS NOT NULL"
    )
    ports = {int(port) for (port,) in rows.fetchall()}
    out = subprocess.run(
        ["ss", "-tinH", "state", "established", "( sport = :5432 )"],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    seg_in = seg_out = 0
    lines = out.splitlines()
    for head, info in zip(lines[::2], lines[1::2], strict=False):
        try:
            port = int(head.split()[-1].rsplit(":", 1)[1])
        except (IndexError, ValueError):
            continue
        if port not in ports:
            continue
        for field in info.split():
            if field.startswith("data_segs_in:"):
                seg_in += int(field.split(":")[1])
            elif field.startswith("data_segs_out:"):
                seg_out += int(field.split(":")[1])
    return seg_in, seg_out


def cpu_since(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds used between two readings; a process born between counts whole."""
    return sum(now - before.get(pid, 0.0) for pid, now in after.items() if now == now)
