"""Issue 8's outage, on the directory queue: the partner is down for the first 12 s of
a run of `onceq dirq consume` (HTTP effect, default retry policy and breaker) over 200
queued invoices, then up. At most 10 files end in error/, and within 30 s of the
partner's return every other file is called and recorded exactly once.

The invoice stub is a real process started down (`--down-for 12 --down-as …`); a
call it turns away during the outage never reaches its rules, so `by_id` counts
the calls that were really answered.
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pytest

from cli_support import invoke
from dirq_retry_support import files
from mq_support import partner

N = 200
DOWN_S = 12.0


def _queue(root: Path) -> Path:
    q = root / "q"
    assert invoke("dirq", "init", str(q)).returncode == 0
    for i in range(N):
        doc = {"invoiceId": f"INV-{i:03d}", "customer": "ACME", "total": 10}
        (q / "inbox" / f"inv-{i:03d}.json").write_text(json.dumps(doc))
    return q


@pytest.mark.parametrize(
    ("down_as", "more"),
    [("refuse", ()), ("503", ()), ("hang", ("--timeout", "2"))],
)
def test_an_outage_does_not_empty_the_queue_into_error(
    tmp_path: Path, down_as: str, more: tuple[str, ...]
) -> None:
    q = _queue(tmp_path)
    with partner(kind="invoices", args=("--down-for", str(DOWN_S), "--down-as", down_as)) as p:
        back = time.monotonic() + DOWN_S  # the stub is up by itself from then on
        r = invoke(
            "dirq", "consume", str(q), "--id-field", "invoiceId",
            "--url", f"{p.url}/api/invoices", "--json", *more, timeout=180,
        )  # fmt: skip
        ended = time.monotonic()
        stats = p.stats()
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["quarantined"] <= 10, out
    assert ended - back <= 30, (ended - back, out)  # drained within 30 s of the return
    done = files(q, "done")
    assert len(done) + len(files(q, "error")) == N
    assert files(q, "inbox") == files(q, "retry") == files(q, "processing") == []
    with closing(sqlite3.connect(q / "ledger.db")) as conn:
        recorded = {r[0] for r in conn.execute("SELECT msg_id FROM messages")}
    assert len(recorded) == len(done) == N - out["quarantined"]
    # Every file that is done was called once, answered (201), and recorded once.
    by_id = stats["by_id"]
    assert all(by_id.get(f"INV-{n[4:7]}") == 1 for n in done), by_id
    # The breaker held the rest while the partner was down: the calls turned away are
    # a handful of probes and the failures that opened it, not 2 per file.
    assert stats.get("calls_during_outage", 0) < 60, stats
