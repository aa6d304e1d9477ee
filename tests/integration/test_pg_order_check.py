"""The order check's default query gives the same rows on PostgreSQL as on SQLite.

`onceq._sources.dirq.order.pg_sql` translates the SQLite query (group_concat, unnamed FROM
subqueries, NULLs first, byte order). Generated ledgers — groups with repeated,
missing, below-start and absent sequence numbers, NULL groups, ids whose order
differs between byte order and a locale — are written to both databases and the two
results compared row for row, order included.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onceq._sources.dirq.order import flow_sql, pg_sql
from pg_support import temp_database

pytestmark = pytest.mark.pg

DDL = "CREATE TABLE messages (flow TEXT NOT NULL, msg_id TEXT NOT NULL, grp TEXT, seq BIGINT,"
DDL += " PRIMARY KEY (flow, msg_id))"
IDS = st.text(alphabet="aAbB-_ 0é.Z", min_size=1, max_size=4)
ROWS = st.lists(
    st.tuples(
        IDS,
        st.one_of(st.none(), st.sampled_from(["o-1", "O-1", "o_2", "b", "é"])),
        st.one_of(st.none(), st.integers(-1, 7)),
    ),
    max_size=25,
    unique_by=lambda r: r[0],
)


@pytest.fixture(scope="module")
def pg() -> Iterator[psycopg.Connection]:
    for url in temp_database():
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(DDL)
            yield conn


def _sqlite_rows(rows: list[tuple[str, str | None, int | None]], sql: str) -> list[tuple]:
    conn = sqlite3.connect(":memory:")
    try:
        conn.execute(DDL)
        conn.executemany("INSERT INTO messages VALUES ('f', ?, ?, ?)", rows)
        return [tuple(r) for r in conn.execute(sql).fetchall()]
    finally:
        conn.close()


def _pg_rows(conn: psycopg.Connection, rows: list[tuple[str, str | None, int | None]], sql: str):
    conn.execute("DELETE FROM messages")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO messages VALUES ('f', %s, %s, %s)", rows)
        cur.execute(sql)
        return [tuple(r) for r in cur.fetchall()], [d.name for d in cur.description]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=ROWS, label=st.sampled_from(["order_no", "group"]))
def test_the_default_order_check_returns_sqlites_rows_on_postgresql(
    pg: psycopg.Connection, rows: list[tuple[str, str | None, int | None]], label: str
) -> None:
    sql = flow_sql("f", label)
    expected = _sqlite_rows(rows, sql)
    got, columns = _pg_rows(pg, rows, pg_sql(sql))
    assert columns == [label, "problem", "seq_from", "seq_to", "n", "msg_ids"]
    assert got == expected, (rows, got, expected)


def test_an_order_with_every_kind_of_problem(pg: psycopg.Connection) -> None:
    """The four problems at once, so the comparison above is never vacuous."""
    rows = [("a", "o", 1), ("b", "o", 1), ("c", "o", 4), ("d", "o", 0), ("e", "o", None)]
    got, _ = _pg_rows(pg, rows, pg_sql(flow_sql("f")))
    assert got == [
        ("o", "no-seq", None, None, 1, "e"),
        ("o", "below-start", 0, 0, 1, "d"),
        ("o", "repeated", 1, 1, 2, "a b"),
        ("o", "gap", 2, 3, 2, ""),
    ]
    assert got == _sqlite_rows(rows, flow_sql("f"))


def test_the_translation_leaves_a_users_query_alone(tmp_path: Path) -> None:
    """Only the default query is translated: pg_sql is not applied to --sql files."""
    from onceq._sources.dirq.order import run_check

    class Book:
        flow, kind = "f", "postgresql"

        def query(self, sql: str) -> tuple[list[str], list[tuple]]:
            return ["sql"], [(sql,)]

    mine = "SELECT group_concat(x, ' ') FROM (SELECT 1 AS x)"
    assert run_check(Book(), mine)[1] == [(mine,)]  # type: ignore[arg-type]
    assert "string_agg" in run_check(Book())[1][0][0]  # type: ignore[arg-type]
