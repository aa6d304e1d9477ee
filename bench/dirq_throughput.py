"""Directory queue throughput: `onceq dirq consume` between a baseline and a ceiling.

    python bench/dirq_throughput.py [--messages 10000] [--repeat 3] [--target 10]
                                    [--compare PATH]

Generates the same messages three times in a temporary directory (on the disk that
holds /tmp; the filesystem type is printed), then consumes them with:

- baseline: what a tutorial would write — per message rename inbox→processing, read,
  json.loads, INSERT OR IGNORE and commit (one transaction per message, SQLite's
  default settings: rollback journal, synchronous FULL), rename to done/;
- onceq, 1 worker and 2 workers (`onceq._exercise.dirq_batch.consume_queue`, `workers=2`,
  exactly what the CLI runs; `onceq.dirq.run.consume` / `consume_parallel` in a checkout
  from before the restructuring): batched commits, WAL + synchronous=FULL, files moved
  by link+unlink after the commit, folders fsynced once per batch;
- ceiling: the same steps with every avoidable cost removed, durability first — one
  process, per file claim (rename) + read + JSON parse (json's scanner called directly,
  as onceq's decoder does for an object) + the field checks, one
  multi-row INSERT per group of 256 with synchronous=OFF (no fsync at all), one
  timestamp per group (as onceq's commit), the field checks written out, a plain
  rename to done/, no folder fsync, no recovery, no failure bookkeeping. No durable
  consumer can beat it; how close onceq gets says what its guarantees cost;
- flow, no effect / flow + SQL effect (issue 7; only where onceq has SqlEffect): the
  same number of invoice messages ({"invoiceId", "customer", "total"}) through a flow
  over the directory queue whose effect is the ledger row alone, and through the same
  flow with a SQL effect that INSERTs one `invoices` row per message in the ledger's
  transaction (the inbox pattern). Target: the SQL effect keeps >= 0.5 of no effect.

Baseline and onceq are durable on their own terms (every commit is fsynced); the
ceiling is not. Each consumer runs --repeat times, interleaved, and the best of its
runs is shown with its ratio to the baseline and to the ceiling; exits 1 when onceq
(1 worker) is under the target.

--compare PATH runs the onceq rows a second time with the checkout at PATH (see
bench/compare.py), in the same interleaved rounds: before/after in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import compare
import onceq

# What `onceq dirq consume [--db D] [--workers N]` runs, without its printing. Resolved
# here, at import, so that neither this process nor a --compare child times the import.
# Before the restructuring, 1 worker and N were two functions (its CLI chose).
_consume_queue = compare.internal(
    "onceq._exercise.dirq_batch:consume_queue", "onceq.dirq.run:consume_parallel"
)
_consume_one = compare.internal(
    "onceq._exercise.dirq_batch:consume_queue", "onceq.dirq.run:consume"
)
# The flow rows' public names, imported now for the same reason (`import onceq` imports
# each on first use); a checkout from before issue 7 has no flow rows.
FLOW_API = {
    name: getattr(onceq, name, None)
    for name in ("run", "Flow", "DirSource", "MessageSpec", "SqlEffect", "Ledger")
}

DUPLICATE_EVERY = 10  # every 10th file re-sends an earlier msg_id
GROUP = 256  # the ceiling's commit group: onceq's (onceq._sources.dirq.open.GROUP)


def message_ids(n: int) -> list[int]:
    """The id number of each of n messages: one in DUPLICATE_EVERY re-sends an earlier one."""
    return [i // 2 if i % DUPLICATE_EVERY == DUPLICATE_EVERY - 1 else i for i in range(n)]


def make_queue(root: Path, n: int, shape: str = "order") -> Path:
    """A queue with n message files (one in DUPLICATE_EVERY a re-sent id).

    shape "order": the exercise's messages (msg_id, order_no, seq, amount); "invoice":
    the issue 7 example's (invoiceId, customer, total), for the flow rows.
    """
    init = [sys.executable, "-m", "onceq", "dirq", "init", str(root)]  # set-up: untimed
    subprocess.run(init, stdout=subprocess.DEVNULL, check=True)
    inbox = root / "inbox"
    for i, mid in enumerate(message_ids(n)):
        if shape == "invoice":
            doc = {"invoiceId": f"INV-{mid:07d}", "customer": f"C-{mid % 97}", "total": i / 4}
        else:
            doc = {"msg_id": f"m-{mid:07d}", "order_no": f"o-{mid % 97}", "seq": i, "amount": i / 4}
        (inbox / f"msg-{i:07d}.json").write_text(json.dumps(doc))
    os.sync()  # generation is not what we time: get its dirty pages out of the way
    return root


def baseline(root: Path) -> int:
    """The tutorial consumer: one message, one transaction, default SQLite settings."""
    conn = sqlite3.connect(str(root / "ledger.db"))
    conn.execute(
        "CREATE TABLE IF NOT EXISTS processed (msg_id TEXT PRIMARY KEY, order_no TEXT,"
        " seq INTEGER, amount REAL, processed_at TEXT)"
    )
    conn.commit()
    inbox, processing, done = root / "inbox", root / "processing", root / "done"
    n = 0
    for name in sorted(os.listdir(inbox)):
        claimed = processing / name
        try:
            os.rename(inbox / name, claimed)
        except FileNotFoundError:
            continue
        doc = json.loads(claimed.read_text())
        conn.execute(
            "INSERT OR IGNORE INTO processed VALUES (?,?,?,?,?)",
            (doc["msg_id"], doc["order_no"], doc["seq"], doc["amount"], datetime.now(UTC)),
        )
        conn.commit()
        os.rename(claimed, done / name)
        n += 1
    conn.close()
    return n


def ceiling(root: Path) -> int:
    """onceq's steps without durability: no fsync anywhere, one process, nothing else.

    Folders are opened once and every claim, read and move is relative to them (as
    onceq does), so the ceiling is not slowed by path walks onceq does not pay either.
    """
    conn = sqlite3.connect(str(root / "ledger.db"), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS processed (msg_id TEXT PRIMARY KEY, order_no TEXT,"
        " seq INTEGER, amount REAL, processed_at TEXT NOT NULL)"
    )
    (root / "processing" / "w-ceiling").mkdir()
    fds = {
        k: os.open(root / k, os.O_RDONLY | os.O_DIRECTORY)
        for k in ("inbox", "processing/w-ceiling", "done")
    }
    inbox, own, done = fds["inbox"], fds["processing/w-ceiling"], fds["done"]
    scan_once = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
    n = 0

    def flush(names: list[str], rows: list[tuple[object, ...]]) -> None:
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO processed VALUES (?,?,?,?,?) ON CONFLICT DO NOTHING", rows)
        conn.execute("COMMIT")
        for name in names:
            os.rename(name, name, src_dir_fd=own, dst_dir_fd=done)

    try:
        names: list[str] = []
        rows: list[tuple[object, ...]] = []
        for name in sorted(os.listdir(inbox)):
            try:
                os.rename(name, name, src_dir_fd=inbox, dst_dir_fd=own)
            except FileNotFoundError:
                continue
            fd = os.open(name, os.O_RDONLY, dir_fd=own)
            try:
                body = os.read(fd, os.fstat(fd).st_size + 1)
            finally:
                os.close(fd)
            # json's own scanner, as onceq's decoder calls it for an object's bytes
            # (json.loads(bytes) would first guess the encoding, then add two frames
            # and two regex matches), and the same check that nothing follows.
            text = body.decode()
            doc, end = scan_once(text, 0)
            if end != len(text) and text[end:].strip(" \t\n\r"):
                sys.exit(f"ceiling: {name} is not a valid message")
            get = doc.get
            msg_id, order_no, seq, amount = (
                get("msg_id"),
                get("order_no"),
                get("seq"),
                get("amount"),
            )
            if msg_id is None or order_no is None or amount is None or seq.__class__ is not int:
                sys.exit(f"ceiling: {name} is not a valid message")
            if not rows:  # one timestamp per group, as onceq's commit takes one `now`
                at = datetime.now(UTC).isoformat()
            rows.append((str(msg_id), str(order_no), seq, amount, at))
            names.append(name)
            n += 1
            if len(names) == GROUP:
                flush(names, rows)
                names, rows = [], []
        if names:
            flush(names, rows)
    finally:
        for fd in fds.values():
            os.close(fd)
        conn.close()
    return n


def consume(root: Path, db: str | None = None, workers: int = 1) -> Any:
    """`onceq dirq consume ROOT [--db DB] [--workers N]`'s run: its Stats."""
    if _consume_queue is _consume_one:  # this layout: one function
        return _consume_queue(root, db, workers=workers)
    return _consume_one(root, db) if workers == 1 else _consume_queue(root, db, None, workers)


def ours(root: Path) -> int:
    return int(consume(root).received)


def ours_2(root: Path) -> int:
    return int(consume(root, workers=2).received)


INVOICES_DDL = (
    "CREATE TABLE IF NOT EXISTS invoices (id TEXT PRIMARY KEY, customer TEXT, total REAL)"
)


def save_invoice(tx: sqlite3.Connection, doc: dict[str, object]) -> None:
    """The SQL effect: one business row per message, in the ledger's own transaction."""
    tx.execute(
        "INSERT INTO invoices (id, customer, total) VALUES (?, ?, ?)",
        (doc["invoiceId"], doc["customer"], doc["total"]),
    )


def has_sql_effect() -> bool:
    """Does this onceq run flows with a SQL effect (issue 7)? The flow rows need it."""
    import inspect

    if None in FLOW_API.values():
        return False
    return "sql" in inspect.signature(onceq.Ledger).parameters


def flow(root: Path, with_sql: bool) -> int:
    """The invoice flow over the directory queue, with or without its SQL effect,
    through the public API (`onceq.run`)."""
    sql = onceq.SqlEffect(save_invoice, setup=INVOICES_DDL) if with_sql else None
    spec = onceq.MessageSpec(id_field="invoiceId", required=("customer", "total"))
    f = onceq.Flow(name="invoices", source=onceq.DirSource(root), message=spec, sql=sql)
    return int(onceq.run(f, ledger=root / "ledger.db", until_empty=True)["invoices"].received)


def flow_plain(root: Path) -> int:
    return flow(root, with_sql=False)


def flow_sql(root: Path) -> int:
    n = flow(root, with_sql=True)
    with sqlite3.connect(str(root / "ledger.db")) as conn:
        rows = conn.execute("SELECT count(*) FROM invoices").fetchone()[0]
    distinct = len(set(message_ids(n)))
    if rows != distinct:
        sys.exit(f"flow + SQL effect: {rows} invoices rows for {distinct} distinct ids")
    return n


RUNNERS: dict[str, Callable[[Path], int]] = {
    "baseline": baseline,
    "ceiling": ceiling,
    "ours": ours,
    "ours_2": ours_2,
    "flow": flow_plain,
    "flow_sql": flow_sql,
}
SHAPES = {"flow": "invoice", "flow_sql": "invoice"}


def filesystem(path: Path) -> str:
    out = subprocess.run(
        ["df", "--output=fstype,source", str(path)], capture_output=True, text=True, check=False
    )
    lines = out.stdout.split()
    return f"{lines[2]} on {lines[3]}" if len(lines) >= 4 else "unknown"


def measure(
    base: Path, label: str, n: int, run: Callable[[Path], int], shape: str = "order"
) -> float:
    """Messages per second of one run over a fresh queue of n messages."""
    root = make_queue(base / label, n, shape)
    t0 = time.perf_counter()
    handled = run(root)
    elapsed = time.perf_counter() - t0
    done = len(os.listdir(root / "done"))
    if handled != n or done != n:
        sys.exit(f"{label}: handled {handled}, done/ holds {done}, expected {n}")
    # Errors ignored: SQLite may still be deleting ledger.db-wal for a millisecond after
    # the run returned (seen with both layouts), and the base folder goes at the end.
    shutil.rmtree(root, ignore_errors=True)
    return n / elapsed


def measure_named(base: str, label: str, n: int, runner: str) -> float:
    """`measure` by runner name: what a --compare child (bench/compare.py) calls."""
    return measure(Path(base), label, n, RUNNERS[runner], SHAPES.get(runner, "order"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--messages", type=int, default=10_000, help="messages per run")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; the best of each is shown")
    ap.add_argument("--target", type=float, default=10.0, help="required ratio vs baseline")
    ap.add_argument("--sql-target", type=float, default=0.5, help="required SQL effect / no effect")
    compare.add_argument(ap)
    args = ap.parse_args()
    other = compare.open_checkout(args.compare) if args.compare else None

    n = args.messages
    base = Path(tempfile.mkdtemp(prefix="onceq-bench-"))
    try:
        print(f"{n} messages x {args.repeat} rounds in {base} ({filesystem(base)})")
        print(f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version}, ", end="")
        print(f"{os.cpu_count()} cpu(s), {platform.machine()}")
        this = compare.here()
        print(f"onceq: {this.label} ({this.root})", end="")
        print(f"; --compare {other.label} ({other.root}, {other.python})" if other else "")
        Run = Callable[[str], float]  # the run's folder label → msgs/s

        def local(runner: str) -> Run:
            return lambda label: measure(
                base, label, n, RUNNERS[runner], SHAPES.get(runner, "order")
            )

        def remote(runner: str) -> Run:
            assert other is not None
            return lambda label: other.call(
                "dirq_throughput", "measure_named", str(base), label, n, runner
            )

        # (row label, key, run); a key ending in "@other" is --compare's code.
        runs: list[tuple[str, str, Run]] = [
            ("baseline (1 txn/msg, default SQLite)", "baseline", local("baseline")),
            ("ceiling (same steps, no fsync, 1 proc)", "ceiling", local("ceiling")),
            ("onceq dirq consume", "ours", local("ours")),
            ("onceq dirq consume --workers 2", "ours_2", local("ours_2")),
        ]
        if other:
            runs.insert(3, (f"  the same, {other.label}", "ours@other", remote("ours")))
            runs.append((f"  the same, {other.label}", "ours_2@other", remote("ours_2")))
        flows = has_sql_effect()
        if flows:
            runs.append(("flow (invoices), no effect", "flow", local("flow")))
            runs.append(("flow + SQL effect (INSERT INTO invoices)", "flow_sql", local("flow_sql")))
        # The other checkout's flow rows only where it has flows too (not before issue 7).
        other_flows = bool(other and other.call("dirq_throughput", "has_sql_effect"))
        if other_flows:
            runs.insert(-1, (f"  the same, {other.label}", "flow@other", remote("flow")))
            runs.append((f"  the same, {other.label}", "flow_sql@other", remote("flow_sql")))
        # Interleaved rounds, best of each: a burst of load from elsewhere on the
        # machine hits every consumer alike instead of one of them.
        best = dict.fromkeys((key for _, key, _ in runs), 0.0)
        for r in range(args.repeat):
            for i, (_, key, run) in enumerate(runs):
                best[key] = max(best[key], run(f"r{r}-{i}"))
    finally:
        shutil.rmtree(base, ignore_errors=True)

    ref, top = best["baseline"], best["ceiling"]
    print(f"\n{'consumer':<44} {'msgs/s':>10} {'vs base':>8} {'of ceil':>8}")
    for label, key, _ in runs:
        rate = best[key]
        print(f"{label:<44} {rate:>10.0f} {rate / ref:>7.1f}x {rate / top:>8.2f}")
    print("(of ceil: the fraction of the no-durability loop; --workers 2 against its 1 process)")
    if other:
        one, two = best["ours"] / best["ours@other"], best["ours_2"] / best["ours_2@other"]
        print(f"\nthis / {other.label}: 1 worker {one:.2f}, --workers 2 {two:.2f}", end="")
        if other_flows:
            plain, sql = (
                best["flow"] / best["flow@other"],
                best["flow_sql"] / best["flow_sql@other"],
            )
            print(f", flow {plain:.2f}, flow + SQL effect {sql:.2f}", end="")
        print()
    if flows:
        sql_ratio = best["flow_sql"] / best["flow"]
        print(f"\nSQL effect / no effect: {sql_ratio:.2f}")
    ratio = best["ours"] / ref
    met = ratio >= args.target
    verdict = "MET" if met else "NOT MET"
    print(f"\ntarget >= {args.target:g}x baseline (1 worker): {verdict} ({ratio:.1f}x)")
    if flows:
        sql_met = sql_ratio >= args.sql_target
        print(
            f"target SQL effect >= {args.sql_target:g} of no effect:"
            f" {'MET' if sql_met else 'NOT MET'} ({sql_ratio:.2f})"
        )
        met = met and sql_met
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
