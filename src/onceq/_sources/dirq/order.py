"""The order check: repeated and missing sequence numbers per order_no.

It reads only what the senders said, the `seq` stored in `processed`, never the
time a row was processed: processing order is the queue's business (parallel
consumers, replays), sequence order is the sender's promise.

The default query reports one row per problem, sorted by order_no and position:

| problem    | seq_from..seq_to            | n                          | msg_ids              |
| repeated   | the seq held by >1 message  | how many messages hold it  | those ids, sorted    |
| gap        | the missing numbers         | how many are missing       |                      |
| below-start| a seq under 1               | how many messages hold it  | those ids            |
| no-seq     | (empty)                     | messages without a seq     | those ids            |

Sequences start at 1: an order whose smallest seq is 3 is missing 1..2 (its first
messages never arrived), which is reported as a gap. Duplicate *messages* (the same
msg_id twice) never reach `processed`, so a repeated seq always means two different
messages claim the same place in an order.

A user's query (--sql FILE) runs instead of the default, read-only (the ledger sets
`query_only`); whatever rows it returns are the problems.

On a PostgreSQL ledger the default query is the same text translated once
(`pg_sql`): PostgreSQL has string_agg, not group_concat, wants a name for every
subquery in FROM (before version 16), sorts NULLs last and text by the database's
locale. The translation makes it return the very rows SQLite returns, in the same
order (NULLs first, text in byte order: COLLATE "C"), so one queue gives one result
whichever ledger it uses. A user's --sql is the user's own dialect, run as given.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

from onceq._ledger.sqlite import Ledger, check_flow_name
from onceq.errors import NotFound, UsageError

DEFAULT_SQL = """\
-- onceq order check: per order_no, repeated seq values and gaps in seq.
-- Uses the senders' sequence numbers (processed.seq), never processing times.
-- Sequences start at 1: a first seq above 1 means the missing numbers are a gap.
-- No rows = OK.
WITH numbered AS (
    SELECT order_no, seq, count(*) AS n, group_concat(msg_id, ' ') AS msg_ids
    FROM (SELECT order_no, seq, msg_id FROM processed ORDER BY msg_id)
    WHERE seq IS NOT NULL
    GROUP BY order_no, seq
),
stepped AS (
    SELECT order_no, seq,
           coalesce(lag(seq) OVER (PARTITION BY order_no ORDER BY seq), 0) AS prev
    FROM numbered
    WHERE seq >= 1
),
problems AS (
    SELECT order_no, 'repeated' AS problem, seq AS seq_from, seq AS seq_to, n, msg_ids
    FROM numbered WHERE n > 1 AND seq >= 1
    UNION ALL
    SELECT order_no, 'gap', prev + 1, seq - 1, seq - prev - 1, ''
    FROM stepped WHERE seq - prev > 1
    UNION ALL
    SELECT order_no, 'below-start', seq, seq, n, msg_ids
    FROM numbered WHERE seq < 1
    UNION ALL
    SELECT order_no, 'no-seq', NULL, NULL, count(*), group_concat(msg_id, ' ')
    FROM (SELECT order_no, msg_id FROM processed WHERE seq IS NULL ORDER BY msg_id)
    GROUP BY order_no
)
SELECT order_no, problem, seq_from, seq_to, n, msg_ids
FROM problems
ORDER BY order_no, seq_from, problem;
"""

OK = "OK"


def read_sql(path: str | Path) -> str:
    """The query in a user's file, or the error that says why there is none."""
    p = Path(path)
    try:
        sql = p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise NotFound(f"{p}: no such SQL file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{p}: cannot read the SQL file: {exc}") from exc
    if not strip_comments(sql).strip(" \t\r\n;"):
        raise UsageError(f"{p}: holds no SQL statement")
    return sql


def strip_comments(sql: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


def flow_sql(flow: str, group_label: str = "order_no") -> str:
    """DEFAULT_SQL over one flow's dedup rows (`messages`: grp, seq) instead of the
    exercise's `processed` table, so the check works for any flow that declares a
    group and a sequence field. The group column is named `group_label` (the flow's
    group field; order_no for the presets, whose output stays what it was).

    `flow` is a checked flow name (`onceq._ledger.sqlite.check_flow_name`: no quote can
    occur in it), so it is written into the query as a literal.
    """
    check_flow_name(flow)
    label = '"' + group_label.replace('"', '""') + '"'
    rows = f"(SELECT grp AS order_no, seq, msg_id FROM messages WHERE flow = '{flow}')"
    body = DEFAULT_SQL.split("WITH numbered", 1)[1].replace(" FROM processed", f" FROM {rows}")
    body = body.replace("SELECT order_no, problem,", f"SELECT order_no AS {label}, problem,")
    return f"-- onceq order check of the flow {flow}\nWITH numbered{body}"


def pg_sql(sql: str) -> str:
    """DEFAULT_SQL (or `flow_sql`'s) in PostgreSQL's dialect, returning SQLite's rows.

    Only the default query's own constructs are translated (it is text we wrote, so
    the patterns are exact): group_concat → string_agg ordered by the id, a name for
    each FROM subquery, NULLS FIRST and byte order (COLLATE "C") in the final sort.
    """
    sql = re.sub(
        r"group_concat\((\w+), ' '\)", r"""string_agg(\1, ' ' ORDER BY \1 COLLATE "C")""", sql
    )
    out, depth, names, opened = [], 0, 0, []
    i = 0
    while i < len(sql):
        if sql.startswith("FROM (", i):
            out.append("FROM (")
            depth += 1
            opened.append(depth)
            i += len("FROM (")
            continue
        ch = sql[i]
        out.append(ch)
        if ch == "(":
            depth += 1
        elif ch == ")":
            if opened and opened[-1] == depth:
                opened.pop()
                names += 1
                out.append(f" AS s{names}")
            depth -= 1
        i += 1
    sql = "".join(out)
    return sql.replace(
        "\nORDER BY order_no, seq_from, problem;",
        '\nORDER BY order_no COLLATE "C" NULLS FIRST, seq_from NULLS FIRST, problem COLLATE "C";',
    )


def run_check(
    ledger: Ledger, sql: str | None = None, group_label: str = "order_no"
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """(columns, rows) of the order query; no rows means the order is intact.

    Without `sql`, the ledger's own flow is checked (`flow_sql`), in the ledger's
    dialect (`pg_sql` on PostgreSQL).
    """
    if sql is None:
        sql = flow_sql(ledger.flow, group_label)
        if getattr(ledger, "kind", "sqlite") == "postgresql":
            sql = pg_sql(sql)
    return ledger.query(sql)


def check_order(ledger: Ledger, sql: str | None = None) -> list[tuple[Any, ...]]:
    """The problem rows the order query finds (empty: OK)."""
    return run_check(ledger, sql)[1]


def render(columns: list[str], rows: list[tuple[Any, ...]]) -> str:
    """`OK` alone when there are no rows; else a header line and one CSV line per row."""
    if not rows:
        return f"{OK}\n"
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    w.writerows(["" if v is None else v for v in row] for row in rows)
    return buf.getvalue()
