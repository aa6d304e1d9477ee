"""Twins on the directory queue: `dirq consume --workers 2` with an HTTP effect.

Two files per invoice (`a-…` and `b-…`, the same invoiceId) in one queue, consumed by
two worker processes on one ledger (an SQLite file: FileGuard's byte-range locks; a
PostgreSQL database: advisory locks). The invoice stub holds every call until all 2N
files are claimed (each worker holds 2 × its call concurrency = N files, and the twins
of several invoices are in two workers: checked). Released, every invoice is recorded
once and called once (by_id), every file done. Without the guard the invoices split
across the workers are called twice (checked by making guard_for return None: by_id
fails); the stub's held count cannot tell, since 2 × 5 concurrent calls = N anyway.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import psycopg

from cli_support import invoke
from dirq_retry_support import files
from mq_support import partner, wait_for

N = 10  # invoices; 2 files each


def ledger_ids(target: str) -> list[str]:
    if target.startswith("postgresql://"):
        with psycopg.connect(target, autocommit=True) as conn:
            return [r[0] for r in conn.execute("SELECT msg_id FROM onceq.messages ORDER BY 1")]
    with closing(sqlite3.connect(target)) as conn:
        return [r[0] for r in conn.execute("SELECT msg_id FROM messages ORDER BY 1")]


def test_twins_in_two_dirq_workers_call_the_partner_once(
    tmp_path: Path, ledger_target: str
) -> None:
    q = tmp_path / "q"
    assert invoke("dirq", "init", str(q)).returncode == 0
    ids = [f"INV-{i:03d}" for i in range(N)]
    for copy in ("a", "b"):  # every first copy sorts before every second one
        for i in ids:
            doc = {"invoiceId": i, "customer": "ACME", "total": 10}
            (q / "inbox" / f"{copy}-{i}.json").write_text(json.dumps(doc))
    with partner(kind="invoices") as p:
        p.hold()
        proc = subprocess.Popen(
            [sys.executable, "-m", "onceq", "dirq", "consume", str(q), "--workers", "2",
             "--id-field", "invoiceId", "--url", f"{p.url}/api/invoices",
             "--timeout", "120",  # the partner holds every call until both workers wait
             "--db", ledger_target, "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            wait_for(lambda: len(files(q, "processing")) == 2 * N, 30)
            wait_for(lambda: p.held() >= N, 30)
            # The twins really were in two processes: ids with a file in each worker.
            folders = [d for d in (q / "processing").iterdir() if d.is_dir()]
            seen = [{n[2:-5] for n in files(d.parent, d.name)} for d in folders]
            split = set.intersection(*seen) if len(seen) == 2 else set()
            print(f"\ninvoices with a copy in each worker: {len(split)} of {N}")
            assert split
            p.release()
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        stats = p.stats()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert summary["processed"] == N and summary["duplicates"] == N, summary
    assert ledger_ids(ledger_target) == ids
    assert stats["by_id"] == dict.fromkeys(ids, 1)
    assert len(files(q, "done")) == 2 * N and files(q, "processing") == []
