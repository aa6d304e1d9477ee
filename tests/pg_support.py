"""PostgreSQL for the tests: a database of its own per test, dropped afterwards.

PostgreSQL runs on 127.0.0.1:5432 with trust authentication for user postgres (see
.ci/run, which starts it when it does not answer). Under CI=true a missing server
fails the test; elsewhere it skips.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator

import pytest

PG_HOST, PG_PORT = "127.0.0.1", 5432
ADMIN_URL = f"postgresql://postgres@{PG_HOST}:{PG_PORT}/postgres"


def pg_answers() -> bool:
    try:
        socket.create_connection((PG_HOST, PG_PORT), timeout=2).close()
    except OSError:
        return False
    return True


def require_pg() -> None:
    if not pg_answers():
        msg = f"PostgreSQL is not answering on {PG_HOST}:{PG_PORT}"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)


def _admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql)


def create_database() -> str:
    """A new empty database; its URL (no password: trust authentication)."""
    require_pg()
    name = f"onceq_test_{uuid.uuid4().hex[:12]}"
    _admin(f'CREATE DATABASE "{name}"')
    return f"postgresql://postgres@{PG_HOST}:{PG_PORT}/{name}"


def drop_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    # FORCE (PostgreSQL 13+): a consumer a test killed may still hold a session.
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def temp_database() -> Iterator[str]:
    url = create_database()
    try:
        yield url
    finally:
        drop_database(url)
