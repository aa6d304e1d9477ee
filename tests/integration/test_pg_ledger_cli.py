"""The commands on a PostgreSQL ledger: same results as on SQLite, never the password.

Every URL here carries a password (trust authentication accepts any), and every
output of every command is searched for it. Each test makes its own database
(pg_support) and drops it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import psycopg
import pytest

from cli_support import invoke, sample_queue
from mq_support import EXERCISE, claim_doc, cli, partner, publish, topology, write_claims
from pg_cli import SECRET, assert_no_leak, with_secret
from support import run_cli

pytestmark = pytest.mark.pg


def _rows(url: str, sql: str, *args: object) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return [tuple(r) for r in conn.execute(sql, args).fetchall()]


def _ok(r: object) -> str:
    out = r.stdout + r.stderr  # type: ignore[attr-defined]
    assert r.returncode == 0, out  # type: ignore[attr-defined]
    assert_no_leak(out, [SECRET])
    return r.stdout  # type: ignore[attr-defined]


def test_dirq_on_postgresql_gives_what_sqlite_gives(tmp_path: Path, pg_url: str) -> None:
    """consume, report, order-check, dead list: the same counts, files and rows."""
    db = with_secret(pg_url)
    lite, pg = sample_queue(tmp_path / "lite"), sample_queue(tmp_path / "pg")
    out = {}
    for q, where in ((lite, []), (pg, ["--db", db])):
        r = invoke("dirq", "consume", str(q), "--json", *where)
        out[q] = json.loads(_ok(r))
        if q == pg:  # a new ledger is announced, masked
            assert f"new ledger at {pg_url.replace('postgres@', 'postgres:***@')}" in r.stderr
    assert out[pg] == out[lite] and out[pg]["processed"] == 15, out
    for q, where in ((lite, []), (pg, ["--db", db])):
        _ok(invoke("dirq", "report", str(q), *where))
        out[q] = (
            (q / "dup.txt").read_text(),
            (q / "error.csv").read_text(),
            _ok(invoke("dirq", "order-check", str(q), *where)),
            [
                {k: v for k, v in d.items() if k != "at"}
                for d in json.loads(_ok(invoke("dirq", "dead", "list", str(q), "--json", *where)))
            ],
        )
    assert out[pg] == out[lite], out
    assert out[pg][2] == "OK\n" and len(out[pg][3]) == 2
    # The rows are in PostgreSQL, in onceq's own schema: 15 processed, 3 duplicates.
    assert _rows(pg_url, "SELECT count(*) FROM onceq.messages") == [(15,)]
    assert _rows(pg_url, "SELECT count(*) FROM onceq.duplicates") == [(3,)]
    assert _rows(pg_url, "SELECT count(*) FROM onceq.processed") == [(15,)]
    assert not (pg / "ledger.db").exists()


def test_order_check_on_postgresql_finds_the_gaps_sqlite_finds(tmp_path: Path, pg_url: str) -> None:
    db = with_secret(pg_url)
    docs = [("a", "o-1", 1), ("b", "o-1", 1), ("c", "o-1", 4), ("d", "o-2", 2)]
    results = []
    for name, where in (("lite", []), ("pg", ["--db", db])):
        q = tmp_path / name / "q"
        for sub in ("inbox", "processing", "done", "error"):
            (q / sub).mkdir(parents=True)
        for mid, order, seq in docs:
            doc = {"msg_id": mid, "order_no": order, "seq": seq, "amount": 1}
            (q / "inbox" / f"{mid}.json").write_text(json.dumps(doc))
        _ok(invoke("dirq", "consume", str(q), *where))
        r = invoke("dirq", "order-check", str(q), "--json", *where)
        assert r.returncode == 1, r.stderr  # problems found
        results.append(json.loads(r.stdout))
    assert results[0] == results[1]
    assert [(r["order_no"], r["problem"]) for r in results[1]["rows"]] == [
        ("o-1", "repeated"),
        ("o-1", "gap"),
        ("o-2", "gap"),
    ]


def test_dirq_workers_share_one_postgresql_ledger(tmp_path: Path, pg_url: str) -> None:
    q = sample_queue(tmp_path)
    # --workers forks: a process of its own, not a fork of the test's.
    stats = json.loads(
        _ok(run_cli("dirq", "consume", str(q), "--db", with_secret(pg_url), "--workers", "2",
                    "--json"))
    )  # fmt: skip
    assert (stats["processed"], stats["duplicates"], stats["quarantined"]) == (15, 3, 2)
    assert len(list((q / "done").iterdir())) == 18
    assert _rows(pg_url, "SELECT count(*) FROM onceq.messages") == [(15,)]


def test_dirq_replay_and_dead_list_on_postgresql(tmp_path: Path, pg_url: str) -> None:
    db = with_secret(pg_url)
    q = sample_queue(tmp_path)
    _ok(invoke("dirq", "consume", str(q), "--db", db))
    _ok(invoke("dirq", "replay", str(q), "msg-009.json", "--db", db))
    _ok(invoke("dirq", "replay", str(q), "--reason", "missing-field", "--db", db))
    assert sorted(p.name for p in (q / "inbox").iterdir()) == ["msg-009.json", "msg-015.json"]
    assert _rows(pg_url, "SELECT transport, op, count FROM onceq.dead_ops") == [
        ("dirq", "replay", 1)
    ]
    assert _rows(pg_url, "SELECT count(*) FROM onceq.replays") == [(2,)]
    # Consumed again: both fail again, their attempts counted from the replay.
    _ok(invoke("dirq", "consume", str(q), "--db", db))
    listed = json.loads(_ok(invoke("dirq", "dead", "list", str(q), "--db", db, "--json")))
    assert [(d["file"], d["attempts"]) for d in listed] == [
        ("msg-009.json", 1),
        ("msg-015.json", 1),
    ]


def test_reading_commands_never_create_a_postgresql_ledger(tmp_path: Path, pg_url: str) -> None:
    """report, order-check, dead list, replay --all on a database without onceq's
    schema: exit 3, one masked line, and still no schema afterwards."""
    db = with_secret(pg_url)
    q = sample_queue(tmp_path)
    for args in (
        ["dirq", "report", str(q)],
        ["dirq", "order-check"],
        ["dirq", "dead", "list", str(q)],
        ["dirq", "replay", str(q), "--all"],
        ["mq", "dead", "list"],
    ):
        r = invoke(*args, "--db", db)
        assert r.returncode == 3, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert_no_leak(r.stdout + r.stderr, [SECRET], args)
    assert _rows(pg_url, "SELECT count(*) FROM pg_namespace WHERE nspname = 'onceq'") == [(0,)]


@pytest.mark.broker
def test_mq_consume_into_postgresql_with_eai_mq_db(
    tmp_path: Path, amqp_url: str, pg_url: str
) -> None:
    """The claims preset through the stub into PostgreSQL; a re-sent copy is a duplicate
    (the claim system called once), the dead letter's reason is in PostgreSQL too."""
    db = with_secret(pg_url)
    topology(amqp_url)
    docs = [claim_doc(f"g-{i}") for i in range(6)] + [claim_doc("g-0"), claim_doc("bad", docs=[])]
    publish(amqp_url, *write_claims(tmp_path / "c", docs))
    with partner() as p:
        r = cli(amqp_url, "mq", "consume", "--claim", p.url, "--until-empty", "--json",
                *EXERCISE, EAI_MQ_DB=db)  # fmt: skip
        stats = json.loads(_ok(r))
        assert (stats["processed"], stats["duplicates"], stats["dead"]) == (6, 1, 1), stats
        assert stats["db"] == pg_url.replace("postgres@", "postgres:***@")
        assert all(n == 1 for n in p.stats()["by_guid"].values())
    assert _rows(pg_url, "SELECT count(*) FROM onceq.messages WHERE source = 'amqp'") == [(6,)]
    assert _rows(pg_url, "SELECT count(*) FROM onceq.processed") == [(6,)]
    listed = json.loads(_ok(cli(amqp_url, "mq", "dead", "list", "--json", EAI_MQ_DB=db)))
    assert [(d["message_id"], d["reason"], d["in_ledger"]) for d in listed["letters"]] == [
        ("bad", "http-422", True)
    ], listed
    replayed = json.loads(_ok(cli(amqp_url, "mq", "dead", "replay", "--all", "--json", "--db", db)))
    assert replayed["done"] == 1, replayed
    assert _rows(pg_url, "SELECT transport, op, count FROM onceq.dead_ops") == [
        ("amqp", "replay", 1)
    ]


SQL_FLOWS = """\
ledger = "postgresql://postgres:${PGPW}@127.0.0.1:5432/DBNAME"

[flows.orders]
source = "dirq"
path = "q"
id_field = "msg_id"
required = ["amount"]
group_field = "order_no"
seq_field = "seq"
retry = "none"

[flows.orders.sql]
function = "book:book"
setup = "CREATE TABLE IF NOT EXISTS public.booked (id TEXT PRIMARY KEY, amount REAL)"
"""

BOOK = """\
def book(tx, doc):
    # psycopg's placeholders on a PostgreSQL ledger: %s
    tx.execute("INSERT INTO public.booked (id, amount) VALUES (%s, %s)",
               (doc["msg_id"], doc["amount"]))
"""


def test_a_flow_file_with_a_postgresql_ledger_and_an_sql_effect(
    tmp_path: Path, pg_url: str
) -> None:
    """`onceq run` into PostgreSQL: the business rows written once per message in the
    ledger's transaction; run again over re-sent copies: not one row more."""
    name = pg_url.rsplit("/", 1)[1]
    (tmp_path / "flows.toml").write_text(SQL_FLOWS.replace("DBNAME", name))
    (tmp_path / "book.py").write_text(BOOK)
    q = sample_queue(tmp_path)
    env = {"PGPW": SECRET}
    out = _ok(invoke("check", str(tmp_path / "flows.toml"), env=env))
    assert "ledger postgresql://postgres:***@127.0.0.1:5432/" in out
    r = invoke("run", str(tmp_path / "flows.toml"), "--until-empty", "--json", env=env)
    report = json.loads(_ok(r))
    assert report["ledger"] == f"postgresql://postgres:***@127.0.0.1:5432/{name}"
    assert report["flows"]["orders"]["processed"] == 15, report
    assert "new ledger at postgresql://postgres:***@" in r.stderr
    booked = _rows(pg_url, "SELECT count(*), count(DISTINCT id) FROM public.booked")
    assert booked == [(15, 15)]
    # The same messages again (all of done/ back into inbox/): duplicates, no new rows.
    for f in (q / "done").iterdir():
        shutil.move(f, q / "inbox" / f.name)
    r = invoke("run", str(tmp_path / "flows.toml"), "--until-empty", "--json", env=env)
    again = json.loads(_ok(r))["flows"]["orders"]
    assert (again["processed"], again["duplicates"]) == (0, 18), again
    assert "new ledger" not in r.stderr
    assert _rows(pg_url, "SELECT count(*) FROM public.booked") == [(15,)]


def test_the_python_api_takes_a_url(tmp_path: Path, pg_url: str) -> None:
    import onceq

    q = sample_queue(tmp_path)
    flow = onceq.Flow("api", onceq.DirSource(q), onceq.MessageSpec(id_field="msg_id"))
    stats = onceq.run(flow, ledger=with_secret(pg_url), until_empty=True)["api"]
    # No field required but the id: msg-015 (no amount) too; msg-009 does not parse.
    assert (stats.processed, stats.duplicates, stats.dead) == (16, 3, 1)
    assert _rows(pg_url, "SELECT count(*) FROM onceq.messages WHERE flow = 'api'") == [(16,)]


@pytest.mark.parametrize(
    ("where", "why"),
    [
        ("127.0.0.1:5432/nosuchdb_onceq", 'database "nosuchdb_onceq" does not exist'),
        ("127.0.0.1:1/x", "Connection refused"),
        ("no-such-host.invalid:5432/x", "failed to resolve host"),
    ],
)
def test_a_ledger_that_cannot_be_opened_is_exit_8_in_one_masked_line(
    tmp_path: Path, where: str, why: str
) -> None:
    """Every command that opens a ledger: exit 8, one line naming the URL masked and
    the driver's reason, the queue untouched."""
    from support import snapshot

    q = sample_queue(tmp_path)
    url = f"postgresql://postgres:{SECRET}@{where}"
    before = snapshot(tmp_path)
    for args in (
        ["dirq", "consume", str(q), "--db", url],
        ["dirq", "report", str(q), "--db", url],
        ["dirq", "replay", str(q), "--all", "--db", url],
    ):
        r = invoke(*args)
        assert r.returncode == 8, (args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"onceq: postgresql://postgres:***@{where}: cannot open the ledger"
        ), lines
        assert why in lines[0], lines
        assert_no_leak(r.stdout + r.stderr, [SECRET], args)
    assert snapshot(tmp_path) == before
