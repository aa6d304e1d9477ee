"""Retention: removing the ledger's old rows (`prune`) and saying what it holds (`stats`).

A ledger that only grows is one someone deletes by hand one day, and with it every
id it would have refused. `prune` removes what is older than a window, in small
batches, on either kind of ledger (SQLite or PostgreSQL), through the ledgers' shared
private query interface (`_transaction`, `_rows`, `_q1`: SQLite-style `?` SQL on
both). What differs between the two kinds is how their storage is sized
(`storage_size`, each ledger's own) and nothing else.

What goes, per flow (`flows=None`: every flow in the ledger):

    table       measured on     removed when older than the cutoff, except
    messages    processed_at    -
    duplicates  seen_at         -
    failures    at              a message's failures go together, and only when its
                                NEWEST failure is old too (see attempts, below)
    replays     at              while a failure of its message stays (see below)
    dead_ops    finished_at     an operation still running or killed (finished_at NULL)

and in every table with an integer id, the newest row of the table (all flows).

The window is the dedup horizon. A `messages` row is what refuses a second copy of
its message: once it is pruned, a copy that arrives later takes effect again. So the
window must be longer than any copy can be late (a sender's resend period, a backup
restored, a dead letter replayed); 30 days is a usual choice. Copies of messages
inside the window are refused exactly as before, while the prune runs and after.

What must stay even when old:

- Attempts. A message's attempt count is the failures of its msg_id since its last
  replay (`onceq._ledger.ops`). A message waiting in a retry tier has spent attempts
  whose failures may be older than the cutoff (tiers 5s, 30s, 2m, 10m: its first
  failure is ~13 min old when it waits in the last tier). Removing those would give
  it its retries again. So a failure goes only with all its message's failures: when
  the newest is older than the cutoff, the message has not been tried for longer
  than the window, and with a window at least the longest retry delay it is no
  longer waiting in a tier (it succeeded, it is dead, or a copy is all that is left).
  `check_window` refuses a shorter window (unless forced): with one, a message in
  its last tier could lose its attempts and be retried more than its policy allows.
  A dead letter left in its dead-letter queue longer than the window loses its
  story (reason, attempts, when): replay or purge dead letters within the window.
- Replays. A replay hides the failures before it (`reset_after`): removing it while
  those failures stay would count them again, and a replayed message could die at
  once on its old attempts. A replay goes only when no failure of its msg_id stays.
  The rule is written so that it gives the same answer before and after the
  failures are pruned, so `dry_run` counts exactly what a real run removes.
- The newest row of each id table. SQLite gives a new row the largest id + 1
  (INTEGER PRIMARY KEY without AUTOINCREMENT): deleting the newest failure would let
  a new failure take an old id, one a kept replay's `reset_after` hides (it would not
  count as an attempt) and one `last_failure` would sort wrongly. Keeping that one
  row keeps every id ever handed out below the next one. (PostgreSQL's sequences
  never reuse an id; the rule costs one row and is the same on both.)
- Business tables are never touched: the presets' `processed` table and the tables
  of a flow's SQL effect hold the effect itself, not the ledger's memory of it. Their
  retention is the application's.

Beside a running consumer each batch is its own short transaction, so a consumer's
commit waits for one batch at most (SQLite: the writers take turns through the busy
timeout; PostgreSQL locks rows, and deleting old rows blocks no commit of new ones).
Measured beside a writer committing back to back (200,000 old rows, batch 1000): its
commits waited p99 8-34 ms, at worst 0.67 s (SQLite), 0.13 s (PostgreSQL); a pause
after each batch made prune 20-100 times slower for a p99 barely lower, so there is
none. SQLite keeps freed pages for new rows (VACUUM would shrink the file under one
long lock: prune never runs it); PostgreSQL's autovacuum reclaims them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from onceq._core.retry import RetryPolicy
from onceq._ledger.ops import Queries
from onceq._ledger.sqlite import check_flow_name
from onceq._ledger.window import check_window, cutoff_of
from onceq.errors import UsageError

__all__ = ["TABLES", "TABLE_NAMES", "Table", "check_window", "cutoff_of", "prune", "stats"]

DEFAULT_BATCH = 1000


@dataclass(frozen=True)
class Table:
    """One ledger table as retention sees it.

    `key`: its primary key after the flow (a batch is a key range; ("id",): the id
    alone, a table of every flow); `time`: the column the window is measured on;
    `keep`: SQL (:name parameters) that holds for the old rows that may go — what
    must stay is left out there; `oldest`: the column `stats` reports the oldest of.
    """

    name: str
    key: tuple[str, ...]
    time: str
    keep: str = ""
    oldest: str = ""

    @property
    def by_id(self) -> bool:
        return self.key == ("id",)


# In the order prune runs them: failures before replays and replays before dead_ops
# is not needed for correctness (each rule reads only rows that stay), but it makes a
# prune that is stopped midway leave what a full one would have left, table by table.
TABLES = (
    Table("messages", ("msg_id",), "processed_at"),
    Table("duplicates", ("msg_id", "ref"), "seen_at"),
    Table(
        "failures",
        ("id",),
        "at",
        # The NEWEST failure of the message is old too (a message whose retries are
        # still running keeps all its attempts). A failure without msg_id (it never
        # parsed) counts for no message.
        " AND id < :hw AND (msg_id IS NULL OR NOT EXISTS (SELECT 1 FROM failures AS g"
        " WHERE g.flow = failures.flow AND g.msg_id = failures.msg_id AND g.at >= :cut))",
    ),
    Table(
        "replays",
        ("id",),
        "at",
        # No failure of its msg_id stays: none is new, and none is the failures'
        # newest row (kept for ever). Both read only rows that prune never removes,
        # so the answer is the same before and after the failures' batches.
        " AND id < :hw AND (msg_id IS NULL OR NOT EXISTS (SELECT 1 FROM failures AS g"
        " WHERE g.flow = replays.flow AND g.msg_id = replays.msg_id"
        " AND (g.at >= :cut OR g.id >= :fhw)))",
    ),
    Table(
        "dead_ops",
        ("id",),
        "finished_at",
        # finished_at NULL: running, or killed (its audit says so): never pruned.
        " AND id < :hw",
        oldest="started_at",
    ),
)
TABLE_NAMES = tuple(t.name for t in TABLES)


# --- SQL ------------------------------------------------------------------------------

_NAME = re.compile(r":([a-z]\w*)")


def _sql(text: str, values: dict[str, Any]) -> tuple[str, list[Any]]:
    """`:name` → `?`, with the arguments in the order they appear (both kinds bind `?`)."""
    args: list[Any] = []

    def one(m: re.Match[str]) -> str:
        args.append(values[m[1]])
        return "?"

    return _NAME.sub(one, text), args


def _old(t: Table) -> str:
    """The rows of flow :flow that may go (the keep rules in `TABLES`).

    In a table keyed by id, `flow || ''` keeps the flow out of the (flow, msg_id)
    index on purpose, on both databases: a batch deletes an id range, and through
    that index each batch would read all of the flow's rows again (SQLite chose it:
    a whole prune quadratic); by the primary key it reads the range's rows only.
    """
    flow = "flow || '' = :flow" if t.by_id else "flow = :flow"
    return f"{flow} AND {t.time} < :cut{t.keep}"


def _range(t: Table, lo: Sequence[Any] | None, hi: Sequence[Any] | None) -> tuple[str, dict]:
    """The key range (lo, hi] as SQL (row values: `(msg_id, ref) > (?, ?)`), and its values."""
    cols = ", ".join(t.key)
    text, values = "", {}
    for name, op, key in (("lo", ">", lo), ("hi", "<=", hi)):
        if key is not None:
            text += f" AND ({cols}) {op} ({', '.join(f':{name}{i}' for i in range(len(key)))})"
            values.update({f"{name}{i}": v for i, v in enumerate(key)})
    return text, values


# --- prune ----------------------------------------------------------------------------

# progress(table, flow, removed so far in that table and flow), after each batch.
Progress = Callable[[str, str, int], None]


def high_water(ledger: Queries) -> dict[str, int]:
    """max(id) of each id table (every flow), read once before the first batch: that
    row and every newer one stay (see the module's docstring)."""
    out = {}
    for t in TABLES:
        if t.by_id:
            row = ledger._q1(f"SELECT coalesce(max(id), 0) FROM {t.name}", ())
            out[t.name] = int(row[0]) if row else 0
    return out


def ledger_flows(ledger: Queries) -> list[str]:
    """Every flow with a row in any ledger table, sorted."""
    found: set[str] = set()
    for t in TABLES:
        found.update(r[0] for r in ledger._rows(f"SELECT DISTINCT flow FROM {t.name}")[1])
    return sorted(found)


def prune(
    ledger: Queries,
    older_than: float,
    *,
    flows: Sequence[str] | None = None,
    dry_run: bool = False,
    batch: int = DEFAULT_BATCH,
    policies: Mapping[str, RetryPolicy] | None = None,
    force: bool = False,
    now: datetime | None = None,
    progress: Progress | None = None,
) -> dict[str, dict[str, int]]:
    """Remove the rows older than `older_than` seconds; {table: {flow: rows}}.

    `flows`: which flows (None: every flow in the ledger, whatever flow `ledger` was
    opened for). `dry_run` counts what would go and changes nothing. At most `batch`
    rows per table go in one transaction. A window shorter than the longest retry
    delay of the flows in question (`policies`: {flow: RetryPolicy}; the default's
    10 min for a flow not in it) is UsageError, nothing changed, unless `force`. What
    stays even when old, and why: the module's docstring. A stopped prune (a signal, a
    lost connection) leaves each batch it committed removed, nothing half-done.
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise UsageError(f"batch: {batch!r}: must be a whole number, 1 or more")
    names = ledger_flows(ledger) if flows is None else [check_flow_name(f) for f in flows]
    check_window(older_than, names, policies, force=force)
    cut = cutoff_of(older_than, now)
    hw = high_water(ledger)
    out: dict[str, dict[str, int]] = {t.name: {} for t in TABLES}
    for t in TABLES:
        for flow in names:
            values = {"flow": flow, "cut": cut, "hw": hw.get(t.name, 0), "fhw": hw["failures"]}
            if dry_run:
                sql, args = _sql(f"SELECT count(*) FROM {t.name} WHERE {_old(t)}", values)
                row = ledger._q1(sql, args)
                out[t.name][flow] = int(row[0]) if row else 0
            else:
                out[t.name][flow] = _prune_rows(ledger, t, values, batch, progress)
    return out


def _prune_rows(
    ledger: Queries,
    t: Table,
    values: dict[str, Any],
    batch: int,
    progress: Progress | None,
) -> int:
    """Remove one table's old rows of one flow, a key range at a time; how many went.

    A batch is the next `batch` keys after the last range (of the flow, or of the
    whole table when keyed by id), read with no write lock and no condition but the
    key: an index walk on both databases whatever the planner thinks of the old rows'
    share (with the conditions PostgreSQL sorted every old failure again per batch:
    2,400 rows/s, now 55,000). Then one short transaction deletes the range's old
    rows, every rule checked under its lock. One pass over the keys in all.
    """
    cols = ", ".join(t.key)
    scope = "" if t.by_id else "flow = :flow"
    lo: tuple[Any, ...] | None = None
    removed = 0
    while True:
        after, bounds = _range(t, lo, None)
        where = f"{scope}{after}".removeprefix(" AND ")
        sql, args = _sql(
            f"SELECT {cols} FROM {t.name}{' WHERE ' + where if where else ''}"
            f" ORDER BY {cols} LIMIT :batch",
            {**values, **bounds, "batch": batch},
        )
        keys = ledger._rows(sql, args)[1]
        if not keys:
            return removed
        hi = tuple(keys[-1])
        within, bounds = _range(t, lo, hi)
        sql, args = _sql(f"DELETE FROM {t.name} WHERE {_old(t)}{within}", {**values, **bounds})
        with ledger._transaction() as conn:
            removed += max(conn.execute(sql, args).rowcount, 0)
        if progress is not None:
            progress(t.name, values["flow"], removed)
        if len(keys) < batch:  # the last keys there were: all looked at
            return removed
        lo = hi


# --- stats ----------------------------------------------------------------------------


def stats(ledger: Queries) -> dict[str, Any]:
    """What the ledger holds: rows and the oldest row per table and per flow, its size.

    {"ledger": where (a URL's password masked), "kind": "sqlite" | "postgresql",
     "tables": {table: {"rows": n, "oldest": iso | None,
                        "flows": {flow: {"rows": n, "oldest": iso}}}},
     "size_bytes": n, "size": {part: bytes}}: on SQLite the parts are the file and its
    write-ahead log, on PostgreSQL each ledger table (pg_total_relation_size: rows,
    indexes, TOAST). Business tables are neither counted nor sized.
    """
    tables: dict[str, Any] = {}
    for t in TABLES:
        _, rows = ledger._rows(
            f"SELECT flow, count(*), min({t.oldest or t.time}) FROM {t.name}"
            " GROUP BY flow ORDER BY flow"
        )
        per_flow = {flow: {"rows": int(n), "oldest": old} for flow, n, old in rows}
        olds = [f["oldest"] for f in per_flow.values() if f["oldest"] is not None]
        tables[t.name] = {
            "rows": sum(f["rows"] for f in per_flow.values()),
            "oldest": min(olds, default=None),
            "flows": per_flow,
        }
    size = ledger.storage_size()
    return {
        "ledger": str(ledger.path),
        "kind": ledger.kind,
        "tables": tables,
        "size_bytes": sum(size.values()),
        "size": size,
    }
