"""A flow whose HTTP effect cannot work is refused before anything is consumed, and an
exception out of the effect is one line, never a traceback per message.

Real processes, a real broker: the URL's credentials with an Authorization header
(aiohttp's "Cannot combine AUTHORIZATION header with … credentials encoded in URL",
which was a traceback per message, retried for 13 minutes) refused by `dirq consume`,
`mq consume`, `onceq check` and `onceq run` with exit 2, the queue and its folder as
they were and no ledger made. And what slips past the checks — aiohttp made to raise
from the effect by a sitecustomize on PYTHONPATH — is dead at once as config-error
(a ValueError/TypeError) or a transient internal-error (a bug), one masked line each.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from test_mq_consume_own_flow import publish_invoices
from test_mq_flow_names import declare_invoice

from cli_support import invoke
from mq_support import cli, queues
from support import run_cli, snapshot

CONFLICT = ("--url", "http://bob:pwSecret9@127.0.0.1:9/api/invoices",
            "--header", "Authorization: Bearer ${TOK}")  # fmt: skip
ENV = {"TOK": "tokSecret7"}
SECRETS = ("pwSecret9", "tokSecret7")


def _one_refusal(r: object, *names: str) -> None:
    out = r.stdout + r.stderr  # type: ignore[attr-defined]
    assert r.returncode == 2, out  # type: ignore[attr-defined]
    lines = r.stderr.splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1 and "credentials in the URL and an Authorization header" in lines[0]
    assert all(n in lines[0] for n in names), lines[0]
    assert not any(s in out for s in SECRETS) and "Traceback" not in out, out


def _queue(tmp_path: Path, n: int = 2) -> Path:
    (tmp_path / "in").mkdir()
    for i in range(n):
        (tmp_path / "in" / f"inv{i}.json").write_text(f'{{"invoiceId": "INV-{i}"}}')
    q = tmp_path / "q"
    assert invoke("dirq", "init", str(q), "--from", str(tmp_path / "in")).returncode == 0
    return q


def test_dirq_consume_check_and_run_refuse_it_and_touch_nothing(tmp_path: Path) -> None:
    q = _queue(tmp_path)
    before = snapshot(tmp_path)
    r = invoke("dirq", "consume", str(q), "--id-field", "invoiceId", *CONFLICT, env=ENV)
    _one_refusal(r, "--url http://bob:***@127.0.0.1:9/api/invoices")
    assert snapshot(tmp_path) == before
    flows = tmp_path / "flows.toml"
    flows.write_text(
        'ledger = "ledger.db"\n[flows.invoices]\nsource = "dirq"\npath = "q"\n'
        'id_field = "invoiceId"\n[flows.invoices.http]\n'
        'url = "http://bob:pwSecret9@127.0.0.1:9/api/invoices"\n'
        'headers = { Authorization = "Bearer ${TOK}" }\n'
    )
    before = snapshot(tmp_path)
    for args in (["check", str(flows)], ["run", str(flows), "--until-empty"]):
        r = invoke(*args, env=ENV)
        _one_refusal(r, "line 7: flows.invoices.http.url: http://bob:***@")
    assert snapshot(tmp_path) == before
    assert sorted(p.name for p in (q / "inbox").iterdir()) == ["inv0.json", "inv1.json"]
    assert not (q / "ledger.db").exists() and not (tmp_path / "ledger.db").exists()


@pytest.mark.broker
def test_mq_consume_refuses_it_and_the_queue_keeps_its_messages(
    amqp_url: str, tmp_path: Path
) -> None:
    declare_invoice(amqp_url)
    publish_invoices(amqp_url, tmp_path / "inv", 2)
    db = tmp_path / "l.db"
    r = cli(amqp_url, "mq", "consume", "--queue", "invoice.in", "--id-field", "invoiceId",
            *CONFLICT, "--until-empty", "--db", str(db), **ENV)  # fmt: skip
    _one_refusal(r, "--url http://bob:***@127.0.0.1:9/api/invoices")
    assert queues(amqp_url)["invoice.in"] == (2, 0)
    assert not db.exists()


# aiohttp raising while it builds the request, as a configuration mistake the checks
# do not know would make it (the message quotes the header's value).
SITECUSTOMIZE = """\
import os
import aiohttp.client

async def _request(self, *args, **kwargs):
    kind = {"ValueError": ValueError, "RuntimeError": RuntimeError}[os.environ["RAISE"]]
    raise kind("Cannot combine this with that; the header was " + os.environ["TOK"])

aiohttp.client.ClientSession._request = _request
"""


@pytest.mark.parametrize(
    ("raised", "reason", "tries"),
    [("ValueError", "config-error", 1), ("RuntimeError", "internal-error", 2)],
)
def test_an_exception_in_the_effect_is_one_line_per_try_and_a_config_error_is_not_retried(
    tmp_path: Path, raised: str, reason: str, tries: int
) -> None:
    q = _queue(tmp_path, 1)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    # A process of its own: the sitecustomize on its PYTHONPATH patches aiohttp at start.
    r = run_cli("dirq", "consume", str(q), "--id-field", "invoiceId",
                "--url", "http://127.0.0.1:9/api/invoices", "--header", "X-Api-Key: ${TOK}",
                "--retry", "exercise", "--no-breaker",
                env={**ENV, "RAISE": raised, "PYTHONPATH": str(site)})  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 11, out  # its only message failed: the batch says so (exit 11)
    assert "Traceback" not in out and "tokSecret7" not in out, out
    lines = [line for line in r.stderr.splitlines() if "the effect raised" in line]
    assert len(lines) == tries, out  # config-error: no second try
    assert f"message INV-0: the effect raised {raised}: Cannot combine" in lines[0], lines[0]
    assert "the header was ***" in lines[0] and "--log-level debug" in lines[0], lines[0]
    with sqlite3.connect(q / "ledger.db") as conn:
        rows = conn.execute("SELECT reason, attempt, action, detail FROM failures").fetchall()
    conn.close()
    assert [row[:3] for row in rows][-1] == (reason, tries, "dead"), rows
    assert all("tokSecret7" not in row[3] for row in rows), rows
    assert [p.name for p in (q / "error").iterdir()] == ["inv0.json"]
