"""The duplicate lookups on PostgreSQL probe the primary key once per id, whatever
the planner believes about the table.

A consumer's sessions keep their plans: psycopg prepares a statement after a few
runs, and a plpgsql function caches its statements' plans for the life of the
session. A plan made generic while the ledger is young (statistics that say it is
empty) and written as a join of the ids with `messages` reads every row of the flow
(a scan on `flow`, then a hash join) on every tick, for as long as the consumer runs:
measured 0.70 ms a tick at 3,000 rows and 18 ms at 100,000. So each lookup is checked
here in its generic plan, on an empty, never analysed ledger: an index probe on
(flow, msg_id) per id, and no scan of the flow.

The guard's function (`guard_session.CLAIM_FN`) is checked as the server runs it:
auto_explain prints the plans of the statements inside it.
"""

from __future__ import annotations

import re

import psycopg
import pytest

from onceq._ledger.pg import guard_session
from onceq._ledger.pg import ledger as pg_ledger
from onceq._ledger.target import open_ledger

pytestmark = pytest.mark.pg

FLOW = "f"
# What a plan that reads the whole flow shows (on `messages`, or on the join's
# other side); a probe per id shows none of these.
WHOLE_FLOW = re.compile(r"Seq Scan on messages|Bitmap Heap Scan on messages|Hash Join|Merge Join")
PROBE = re.compile(r"Index (Only )?Scan using messages_pkey on messages")


def fresh_ledger(url: str) -> psycopg.Connection[object]:
    """The ledger's schema, never analysed (what a new ledger looks like to the
    planner), and a session that plans every statement generic, as a session does
    once it has run one a few times."""
    open_ledger(url, "mq", flow=FLOW).close()
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("SET plan_cache_mode = force_generic_plan")
    return conn


def generic_plan(conn: psycopg.Connection[object], sql: str, types: str, args: str) -> str:
    """EXPLAIN of `sql` (psycopg's placeholders) prepared with `types`, run with `args`."""
    n = 0

    def number(_m: re.Match[str]) -> str:
        nonlocal n
        n += 1
        return f"${n}"

    conn.execute(f"PREPARE q ({types}) AS {re.sub(r'%[sb]', number, sql)}")
    rows = conn.execute(f"EXPLAIN EXECUTE q ({args})").fetchall()
    return "\n".join(str(r[0]) for r in rows)


def test_the_lookup_probes_each_id(pg_url: str) -> None:
    """The ledger's `processed_refs` and the guard's pipelined batch send this text."""
    assert pg_ledger.LOOKUP_SQL is guard_session.LOOKUP_SQL
    with fresh_ledger(pg_url) as conn:
        plan = generic_plan(conn, guard_session.LOOKUP_SQL, "text, text", """'f', '["a","b"]'""")
    assert PROBE.search(plan), plan
    assert not WHOLE_FLOW.search(plan), plan


def test_the_guards_function_probes_each_id(pg_url: str) -> None:
    notices: list[str] = []
    with fresh_ledger(pg_url) as conn:
        conn.execute(guard_session.CLAIM_FN)
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")
        conn.execute("SET auto_explain.log_min_duration = 0")
        conn.execute("SET auto_explain.log_nested_statements = on")
        conn.execute("SET client_min_messages = log")
        rows = conn.execute(
            guard_session.CLAIM_FN_CALL.replace("%b", "%s"), (FLOW, "[]", '["a","b"]')
        ).fetchall()
    assert rows == []  # both locks granted, neither id recorded
    lookups = [n for n in notices if "onceq.messages" in n]
    assert len(lookups) == 1, notices
    assert PROBE.search(lookups[0]), lookups[0]
    assert not WHOLE_FLOW.search(lookups[0]), lookups[0]
