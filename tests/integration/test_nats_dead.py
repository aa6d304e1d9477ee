"""`onceq nats dead list | replay | purge`: a NATS flow's dead letters, in place.

List takes nothing; replay resets the ledger's attempts first, publishes each back to
the work subject (stored), then deletes the dead letter, with an audit row; purge
records the ids, then deletes; a dry run changes nothing.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

from mq_dead_support import ledger_dump
from mq_support import EXERCISE, partner
from nats_support import (  # noqa: F401
    Names,
    consumer_state,
    nats_names_fixture,
    publish,
    setup,
)
from support import SAMPLE, run_cli

INVOICES = SAMPLE / "invoices"


def cli(names: Names, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("nats", *args, env={"ONCEQ_NATS_URL": names.url}, timeout=120)


def dead(names: Names, action: str, db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    where = ["--stream", names.stream, "--durable", names.durable, "--db", str(db)]
    return cli(names, "dead", action, *where, "--flow", "invoices", "--json", *args)


def test_list_replay_purge(nats_names: Names, tmp_path: Path) -> None:
    setup(nats_names)
    items = [
        ((INVOICES / n).read_bytes(), {"Nats-Msg-Id": i})
        for n, i in (("inv-001.json", "INV-1"), ("inv-005-negative.json", "INV-5"),
                     ("inv-006-busy.json", "INV-6"))
    ]  # fmt: skip
    publish(nats_names, items)
    db = tmp_path / "l.db"
    args = ["--stream", nats_names.stream, "--durable", nats_names.durable, "--flow", "invoices"]
    with partner(kind="invoices") as p:
        r = cli(
            nats_names, "consume", *args, "--id-field", "invoiceId", "--url",
            f"{p.url}/api/invoices", "--db", str(db), "--until-empty", "--json", *EXERCISE,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["dead"] == 2

        r = dead(nats_names, "list", db)
        assert r.returncode == 0, r.stderr
        listed = json.loads(r.stdout)["letters"]
        assert sorted((x["msg_id"], x["reason"], x["attempts"]) for x in listed) == [
            ("INV-5", "http-422", 1),
            ("INV-6", "http-503", 2),
        ]
        assert consumer_state(nats_names)["dead"] == 2  # a list takes nothing

        r = dead(nats_names, "replay", db, "--reason", "http-503", "--dry-run")
        assert r.returncode == 0 and json.loads(r.stdout)["replayed"] == 0
        assert consumer_state(nats_names)["dead"] == 2
        r = dead(nats_names, "replay", db)
        assert r.returncode == 2 and "--all, --id ID or --reason R" in r.stderr

        r = dead(nats_names, "replay", db, "--reason", "http-503")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["replayed"] == 1
        state = consumer_state(nats_names)
        assert (state["dead"], state["pending"]) == (1, 1)
        # Consumed again with its attempts reset: tried twice more, dead again.
        r = cli(
            nats_names, "consume", *args, "--id-field", "invoiceId", "--url",
            f"{p.url}/api/invoices", "--db", str(db), "--until-empty", "--json", *EXERCISE,
        )  # fmt: skip
        assert r.returncode == 11, r.stderr  # its one message failed again
        assert json.loads(r.stdout)["requeued"] == 1
        assert p.stats()["by_id"]["INV-6"] == 4

    # Without a terminal to ask on and without --yes: refused, nothing deleted.
    r = dead(nats_names, "purge", db, "--id", "INV-5")
    assert r.returncode == 2 and "give --yes to delete without asking" in r.stderr, r.stderr
    r = dead(nats_names, "list", db)
    assert sorted(x["msg_id"] for x in json.loads(r.stdout)["letters"]) == ["INV-5", "INV-6"]
    r = dead(nats_names, "purge", db, "--id", "INV-5", "--yes")
    assert r.returncode == 0 and json.loads(r.stdout)["purged"] == 1, r.stderr
    r = dead(nats_names, "list", db)
    assert [x["msg_id"] for x in json.loads(r.stdout)["letters"]] == ["INV-6"]
    with sqlite3.connect(db) as conn:
        ops = conn.execute("SELECT transport, op, count FROM dead_ops ORDER BY id").fetchall()
    assert ops == [("nats", "replay", 1), ("nats", "purge", 1)]
    # A wrong --db creates nothing and says so.
    r = dead(nats_names, "purge", tmp_path / "nope.db", "--all", "--yes")
    assert r.returncode == 3 and not (tmp_path / "nope.db").exists()


def test_the_console_reads_and_acts_through_the_source_type(
    nats_names: Names, tmp_path: Path
) -> None:
    import asyncio

    from onceq._flows.flow import Flow
    from onceq._ledger.sqlite import Ledger
    from onceq._sources import registry
    from onceq._sources.dead_api import DeadSelection
    from onceq._sources.nats.plugin import NatsSource

    setup(nats_names)
    publish(
        nats_names, [(b"{not json", {"Nats-Msg-Id": "bad-1"}), (b"[]", {"Nats-Msg-Id": "bad-2"})]
    )
    db = tmp_path / "l.db"
    args = ["--stream", nats_names.stream, "--durable", nats_names.durable, "--flow", "f"]
    r = cli(nats_names, "consume", *args, "--id-field", "id", "--url", "http://127.0.0.1:9/x",
            "--db", str(db), "--until-empty", "--json")  # fmt: skip
    assert r.returncode == 11 and json.loads(r.stdout)["dead"] == 2, r.stderr
    flow = Flow("f", NatsSource(nats_names.stream, nats_names.durable))
    stype = registry.of(flow.source)
    assert stype is not None and stype.dead_actions == {"replay", "purge"}
    with Ledger(db, "nats", flow="f", create=False) as ledger:
        items = asyncio.run(stype.dead_items(flow, ledger, DeadSelection(), bodies=True))
        assert sorted((i.key, i.reason) for i in items) == [
            ("bad-1", "parse"),
            ("bad-2", "not-object"),
        ]
        assert {i.body for i in items} == {b"{not json", b"[]"}
        assert all(i.where == nats_names.dead_stream for i in items)
        done = asyncio.run(stype.dead_action("purge", flow, ledger, DeadSelection(keys=("bad-1",))))
        assert (done.matched, done.done) == (1, 1) and done.op is not None
        left = asyncio.run(stype.dead_items(flow, ledger, DeadSelection()))
        assert [i.key for i in left] == ["bad-2"]


def _dead_invoices(names: Names, tmp_path: Path, n: int, p: Any) -> tuple[Path, list[str]]:
    """n invoices the partner rejects (422: a negative total), consumed into dead letters."""
    setup(names)
    ids = [f"INV-R{i}" for i in range(n)]
    body = json.loads((INVOICES / "inv-005-negative.json").read_bytes())
    publish(names, [(json.dumps({**body, "invoiceId": i}).encode(), {}) for i in ids])
    db = tmp_path / "l.db"
    r = _consume(names, p, db)
    assert r.returncode == 11 and json.loads(r.stdout)["dead"] == n, r.stderr
    return db, ids


def _consume(names: Names, p: Any, db: Path) -> subprocess.CompletedProcess[str]:
    # --no-guard: every message is meant to be rejected alike (not a misconfiguration).
    where = ["--stream", names.stream, "--durable", names.durable, "--flow", "invoices"]
    return cli(
        names, "consume", *where, "--id-field", "invoiceId", "--url", f"{p.url}/api/invoices",
        "--db", str(db), "--until-empty", "--json", "--no-guard", *EXERCISE,
    )  # fmt: skip


def test_rate_paces_the_replay(nats_names: Names, tmp_path: Path) -> None:
    n, rate = 20, 10.0
    with partner(kind="invoices") as p:
        db, ids = _dead_invoices(nats_names, tmp_path, n, p)
        assert all(p.stats()["by_id"][i] == 1 for i in ids)
        start = time.monotonic()
        r = dead(nats_names, "replay", db, "--all", "--rate", str(rate))
        wall = time.monotonic() - start
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["replayed"] == n
        # n publishes at most `rate` per second: the last one no earlier than (n-1)/rate.
        assert wall >= (n - 1) / rate
        assert wall < (n - 1) / rate + 20  # paced, not stuck (a loaded 2-core machine)
        state = consumer_state(nats_names)
        assert (state["dead"], state["pending"]) == (0, n)
        # Every replayed copy reaches the partner once: each id one call more, none twice.
        r = _consume(nats_names, p, db)
        assert r.returncode == 11 and json.loads(r.stdout)["dead"] == n, r.stderr
        assert {i: p.stats()["by_id"][i] for i in ids} == {i: 2 for i in ids}
    with sqlite3.connect(db) as conn:
        ops = conn.execute("SELECT op, count FROM dead_ops ORDER BY id").fetchall()
        replays = conn.execute("SELECT COUNT(*) FROM replays").fetchone()[0]
    assert ops == [("replay", n)] and replays == n


BAD_RATES = ["0", "-3", "nan", "inf", "abc"]


def test_a_bad_rate_is_refused_in_one_line_and_changes_nothing(
    nats_names: Names, tmp_path: Path
) -> None:
    with partner(kind="invoices") as p:
        db, _ids = _dead_invoices(nats_names, tmp_path, 2, p)
    before, rows = consumer_state(nats_names), ledger_dump(db)
    for bad in BAD_RATES:
        r = dead(nats_names, "replay", db, "--all", "--rate", bad)
        assert r.returncode == 2, (bad, r.stderr)
        assert r.stdout == "" and r.stderr.count("\n") == 1, (bad, r.stderr)
        assert r.stderr.startswith("onceq: nats dead replay: Invalid value for '--rate'"), r.stderr
        assert "Traceback" not in r.stderr
    assert consumer_state(nats_names) == before and ledger_dump(db) == rows
