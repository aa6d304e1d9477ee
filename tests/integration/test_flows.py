"""The invoice example end to end (issue 7): flags and a flow file, on the directory
queue and on RabbitMQ, against `onceq partner invoices` as a real process.

201 processed; 409 recorded as done and counted as a partner duplicate; 422 dead at
once; 503 transient (retried after delays in retry/ on a directory queue, retried once on
RabbitMQ); a `{field}` placeholder URL-encoded; two flows in one ledger never refuse
each other's ids; `onceq run` with two flows in one process; an SQL-effect flow."""

from __future__ import annotations

import http.server
import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from cli_support import invoke
from mq_support import EXERCISE, cli, get_all, partner, queues
from support import SAMPLE, http_server

INVOICES = SAMPLE / "invoices"


def _queue(root: Path, name: str = "q") -> Path:
    q = root / name
    r = invoke("dirq", "init", str(q), "--from", str(INVOICES))
    assert r.returncode == 0, r.stderr
    return q


def _rows(db: Path, sql: str) -> list[tuple]:
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute(sql).fetchall()


def _flags(url: str) -> list[str]:
    return ["--id-field", "invoiceId", "--url", f"{url}/api/invoices", "--json"]


def test_dirq_flags_the_invoice_example(tmp_path: Path) -> None:
    q = _queue(tmp_path)
    with partner(kind="invoices") as p:
        r = invoke(
            "dirq", "consume", str(q), *_flags(p.url), "--keep", "customer,total",
            "--retry-delays", "200ms,400ms",
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        # INV-1, 2, 3, 7 created; the resent INV-1 is our duplicate (no call); 422 INV-5
        # and the id-less file quarantined at once; the always-busy INV-6 (503) retried
        # once at once and after each delay (waiting in retry/), then quarantined.
        assert (out["processed"], out["duplicates"], out["quarantined"]) == (4, 1, 3), out
        assert out["reasons"] == {"http-422": 1, "http-503": 1, "missing-field": 1}
        assert out["requeued_reasons"] == {"http-503": 3}
        assert p.stats()["by_id"].get("INV-1") == 1
        assert p.stats()["by_id"].get("INV-6") == 4
        assert not any((q / "retry").iterdir())  # the run ended with nothing waiting
        db = q / "ledger.db"
        assert _rows(db, "SELECT kept FROM messages WHERE msg_id = 'INV-2'") == [
            ('{"customer":"Globex","total":80}',)
        ]
        # The same messages again under another flow in the same ledger: our ledger has
        # never seen them for this flow, the partner has: 409 = done, partner duplicate.
        again = _queue(tmp_path, "q2")
        r = invoke(
            "dirq", "consume", str(again), *_flags(p.url), "--db", str(db), "--flow", "resend",
            "--retry", "none",
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["partner_duplicates"] == 4 and out["processed"] == 0, out
        assert _rows(
            db, "SELECT count(*) FROM messages WHERE flow = 'resend' AND partner_duplicate = 1"
        ) == [(4,)]


@contextmanager
def _recording_partner() -> Iterator[tuple[str, list[str]]]:
    """A partner that answers 201 and records each request's raw path."""
    paths: list[str] = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            paths.append(self.path)
            self.send_response(201)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with http_server(H) as url:
        yield url, paths


def test_a_placeholder_is_url_encoded(tmp_path: Path) -> None:
    q = _queue(tmp_path)
    with _recording_partner() as (url, paths):
        r = invoke(
            "dirq", "consume", str(q), "--id-field", "invoiceId",
            "--url", url + "/api/invoices/{invoiceId}", "--json",
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "/api/invoices/INV%207%2FA" in paths, paths
    assert "/api/invoices/INV-1" in paths


def test_run_two_flows_in_one_process_one_ledger_overlapping_ids(tmp_path: Path) -> None:
    """A dirq flow with an HTTP effect and a dirq flow with an SQL effect, same ids."""
    _queue(tmp_path, "a")
    _queue(tmp_path, "b")
    (tmp_path / "invoices_app.py").write_text(
        "def save(tx, doc):\n"
        "    tx.execute('INSERT INTO invoices VALUES (?, ?, ?)',"
        " (doc['invoiceId'], doc['customer'], doc['total']))\n"
    )
    with partner(kind="invoices") as p:
        (tmp_path / "flows.toml").write_text(
            'ledger = "./ledger.db"\n'
            '[flows.posted]\nsource = "dirq"\npath = "./a"\nid_field = "invoiceId"\n'
            f'[flows.posted.http]\nurl = "{p.url}/api/invoices"\n'
            '[flows.posted.retry]\nimmediate = 0\ndelays = ["200ms"]\n'
            '[flows.saved]\nsource = "dirq"\npath = "./b"\nid_field = "invoiceId"\n'
            '[flows.saved.sql]\nfunction = "invoices_app:save"\n'
            'setup = "CREATE TABLE IF NOT EXISTS invoices'
            ' (id TEXT PRIMARY KEY, customer TEXT, total REAL)"\n'
        )
        r = invoke("run", str(tmp_path / "flows.toml"), "--until-empty", "--json")
        busy_calls = p.stats()["by_id"]["INV-6"]
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["flows"]["posted"]["processed"] == 4
    # The always-busy INV-6: its flow's policy (no immediate retry, one after 200ms),
    # then quarantined; --until-empty waited for it in a/retry/.
    assert out["flows"]["posted"]["requeued_reasons"] == {"http-503": 1}
    assert busy_calls == 2
    # The SQL flow has no partner: all 7 files with an id are stored, the resent INV-1
    # is a duplicate, and the same ids as the other flow's are never refused.
    assert out["flows"]["saved"]["processed"] == 6
    assert out["flows"]["saved"]["duplicates"] == 1
    db = tmp_path / "ledger.db"
    assert _rows(db, "SELECT count(*) FROM invoices") == [(6,)]
    both = "SELECT count(*) FROM messages WHERE msg_id = 'INV-1'"
    assert _rows(db, both) == [(2,)]


def test_mq_flags_the_invoice_example(amqp_url: str, tmp_path: Path) -> None:
    r = cli(amqp_url, "mq", "topology", "--queue", "invoice.in")
    assert r.returncode == 0, r.stderr
    r = cli(
        amqp_url, "mq", "publish", *map(str, sorted(INVOICES.glob("inv-00[1-7]*.json"))),
        "--exchange", "invoice", "--routing-key", "invoice", "--id-field", "invoiceId",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    db = tmp_path / "ledger.db"
    with partner(kind="invoices") as p:
        r = cli(
            amqp_url, "mq", "consume", "--queue", "invoice.in", *_flags(p.url),
            "--db", str(db), "--until-empty", *EXERCISE,  # requeued once, then dead
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert (out["processed"], out["duplicates"], out["dead"]) == (4, 1, 2), out
        assert out["requeued_reasons"] == {"http-503": 1}
        assert out["reasons"] == {"http-422": 1, "http-503": 1}
        assert p.stats()["by_id"]["INV-6"] == 2  # 503: tried, requeued, tried, dead
    dead = queues(amqp_url)
    assert dead["invoice.in"][0] == 0
    assert len(get_all(amqp_url, "invoice.dead")) == 2
    # --claim with --url is refused before anything runs.
    r = cli(amqp_url, "mq", "consume", "--claim", "http://x:1", "--url", "http://x:1/y")
    assert r.returncode == 2 and "--claim is the claims preset" in r.stderr
