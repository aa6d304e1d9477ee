"""Every command example in README.md, docs/mq.md and docs/api.md runs as written, in order.

Each document's ```sh lines run one by one (rules: tests/docs/doc_examples.py) in a
fresh folder, as a new user would type them after the Quick start: `onceq` and
`python3` resolve to this venv (its bin/ first on PATH; `.venv/bin/` written in a
doc means the same folder), against a RabbitMQ vhost of the test's own
(EAI_AMQP_URL), with the stubs on free ports in place of 9202 and 9300 (the ports
the docs name for the claim and the invoice partner, which another program may
hold). A line that ends with another exit code than the one its `# exit N` comment
announces (0 without one) fails the test, naming the line. The README's PostgreSQL
examples read `$DATABASE_URL`: a database of the test's own, its URL with a password
(trust authentication accepts any), which no line may print.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from doc_examples import DOCS, SKIPPED_SECTIONS, Example, examples

from mq_support import queues
from nats_server import NatsServer, own_nats  # noqa: F401
from pg_cli import SECRET, with_secret
from support import free_port

pytestmark = [pytest.mark.broker, pytest.mark.slow]

VENV_BIN = Path(sys.executable).parent
LINE_TIMEOUT_S = 120.0
DOC_PORTS = ("9202", "9300")  # the claim stub's, the invoice partner's


def _env(
    amqp_url: str, database_url: str | None = None, nats_url: str | None = None
) -> dict[str, str]:
    assert (VENV_BIN / "onceq").is_file(), f"{VENV_BIN}: no onceq here; install the project"
    env = {k: v for k, v in os.environ.items() if k not in ("EAI_MQ_DB", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join([str(VENV_BIN), env.get("PATH", "")])
    env["EAI_AMQP_URL"] = amqp_url
    if nats_url is not None:
        # The test's own server: the README's fixed stream names and 2-minute duplicate
        # window on the shared one would make a second run within it publish nothing.
        env["ONCEQ_NATS_URL"] = nats_url
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    return env


def _as_run(ex: Example, ports: dict[str, int], replace: dict[str, str] | None = None) -> str:
    cmd = ex.command
    for doc_port, port in ports.items():
        cmd = re.sub(rf"\b{doc_port}\b", str(port), cmd)
    for pattern, repl in (replace or {}).items():  # a doc's hosts → the test's own
        cmd = re.sub(pattern, repl, cmd)
    if ex.file:
        return cmd
    return re.sub(r"(?<![\w/])\.venv/bin/", f"{VENV_BIN}/", cmd)


def _report(ex: Example, cmd: str, why: str, out: str = "", err: str = "") -> str:
    return (
        f"{ex.where()}: `{ex.line}` {why}\n  ran: {cmd}\n"
        f"  stdout: {out[-2000:]!r}\n  stderr: {err[-8000:]!r}"
    )


def _run_line(ex: Example, cmd: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """One line, in a process group of its own. One that does not end in time is
    sent SIGABRT first: Python's faulthandler (PYTHONFAULTHANDLER) prints where each of
    its threads was, which the report then shows (a hang seen once in CI left nothing)."""
    proc = subprocess.Popen(
        # -e: in `a; b` a failing `a` is the line's failure, not hidden by `b`.
        ["bash", "-e", "-o", "pipefail", "-c", cmd],
        cwd=cwd,
        env={**env, "PYTHONFAULTHANDLER": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=LINE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            out, err = "", "(no answer to SIGABRT)"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(_report(ex, cmd, f"did not end within {LINE_TIMEOUT_S:.0f}s", out, err))
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _start_background(ex: Example, cmd: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start a `… &` line; return once it has printed its first line (it is ready)."""
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {cmd}"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: stopped whole at the end
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], LINE_TIMEOUT_S)
    first = proc.stdout.readline() if ready else ""
    if not first:
        _stop(proc)
        err = proc.stderr.read() if proc.stderr else ""
        pytest.fail(_report(ex, cmd, "(background) printed nothing and did not start", "", err))
    return proc


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_examples(
    doc: str,
    cwd: Path,
    amqp_url: str,
    database_url: str | None = None,
    replace: dict[str, str] | None = None,
    nats_url: str | None = None,
) -> list[tuple[Example, str]]:
    """Run a document's examples in order; fails at the first one that misbehaves.

    `replace` (regex → replacement) points what the doc names at the test's own
    services, as the ports are (docs/deploy.md's database host → a temporary database).
    """
    todo, _ = examples(doc)
    env = _env(amqp_url, database_url, nats_url)
    # A temporary folder of the doc's own, beside cwd: a doc line that runs pytest
    # (docs/api.md) otherwise shares /tmp/pytest-of-USER with the suite around it, and
    # at its end removes that suite's older numbered folders, hundreds of MB of queues
    # and ledgers: seen in CI as the line not ending within 120 s, its faulthandler
    # stack in pytest's cleanup_numbered_dir.
    scratch = cwd.parent / f"{cwd.name}-tmpdir"
    scratch.mkdir(exist_ok=True)
    env["TMPDIR"] = str(scratch)
    ports = {doc_port: free_port() for doc_port in DOC_PORTS}
    background: list[subprocess.Popen] = []
    ran: list[tuple[Example, str]] = []
    try:
        for ex in todo:
            cmd = _as_run(ex, ports, replace)
            if ex.file:  # a flow file or module the next lines use
                (cwd / ex.file).write_text(cmd)
                ran.append((ex, ""))
                continue
            if ex.background:
                background.append(_start_background(ex, cmd, cwd, env))
                ran.append((ex, ""))
                continue
            started = time.monotonic()
            done = _run_line(ex, cmd, cwd, env)
            if done.returncode != ex.expect:
                pytest.fail(
                    _report(
                        ex,
                        cmd,
                        f"exited {done.returncode}, the doc expects {ex.expect}"
                        f" (after {time.monotonic() - started:.1f}s)",
                        done.stdout,
                        done.stderr,
                    )
                )
            if database_url is not None:
                assert SECRET not in done.stdout + done.stderr, _report(
                    ex, cmd, "printed the database password", done.stdout, done.stderr
                )
            ran.append((ex, done.stdout))
    finally:
        for proc in background:
            _stop(proc)
    return ran


def test_the_skipped_sections_are_the_declared_ones_and_still_exist() -> None:
    """The one skip rule is visible and live: each skipped heading still has its block."""
    for (doc, heading), why in SKIPPED_SECTIONS.items():
        _, skipped = examples(doc)
        assert [b.heading for b in skipped] == [heading], (doc, heading, why)
        assert any(line.strip() for b in skipped for line in b.lines)
    for doc in DOCS:
        todo, _ = examples(doc)
        assert todo, f"{doc}: no ```sh example found (did the fence language change?)"


def test_readme_examples_run_as_written(
    tmp_path: Path,
    amqp_url: str,
    pg_url: str,
    own_nats: NatsServer,  # noqa: F811
) -> None:
    ran = run_examples("README.md", tmp_path, amqp_url, with_secret(pg_url), nats_url=own_nats.url)
    out = {ex.line.split("#")[0].strip(): stdout for ex, stdout in ran}
    # What the prose around the examples promises, checked on the state they leave.
    q = tmp_path / "q"
    # The two files that never parse were quarantined, then replayed (one by reason,
    # the rest with --all): back in inbox/, error/ empty, each replay audited.
    assert sorted(p.name for p in (q / "error").iterdir()) == []
    assert sorted(p.name for p in (q / "inbox").iterdir()) == ["msg-009.json", "msg-015.json"]
    assert _rows(q / "ledger.db", "SELECT transport, op, count FROM dead_ops ORDER BY id") == [
        ("dirq", "replay", 1),
        ("dirq", "replay", 1),
    ]
    assert len(list((q / "done").iterdir())) == 18
    assert (q / "order-result.txt").read_text().strip() == "OK"
    assert "inbox=0 processing=0 error=2" in out["onceq dirq lag ./q 10"]
    assert (tmp_path / "processed.db").exists()
    assert (tmp_path / "lab" / "q" / "order-result.txt").exists()
    _your_own_flow_did_what_the_readme_says(tmp_path, out, amqp_url)
    _the_shared_ledger_did_what_the_readme_says(tmp_path, out, pg_url)
    _the_repairs_did_what_the_readme_says(tmp_path, ran, amqp_url)


def _the_repairs_did_what_the_readme_says(
    tmp_path: Path, ran: list[tuple[Example, str]], amqp_url: str
) -> None:
    """'When messages failed': a real failure on each transport, shown, corrected,
    replayed, and processed; the other dead letters left as they were."""
    section = [(ex, stdout) for ex, stdout in ran if ex.heading.startswith("When messages failed")]
    said = [(ex.command, stdout) for ex, stdout in section if not ex.file]
    consumed = [o for c, o in said if c.startswith(("onceq dirq consume", "onceq mq consume"))]
    assert len(consumed) == 4, said
    assert "8 received, 4 processed, 1 duplicates" in consumed[0], consumed[0]
    assert "3 quarantined" in consumed[0], consumed[0]
    assert "1 received, 1 processed" in consumed[1] and "0 quarantined" in consumed[1]
    assert "1 received, 0 processed" in consumed[2] and "1 dead" in consumed[2], consumed[2]
    assert "1 received, 1 processed" in consumed[3] and "0 dead" in consumed[3], consumed[3]
    listed = [o for c, o in said if c.startswith(("onceq dirq dead list", "onceq mq dead list"))]
    assert "inv-005-negative.json  http-422  attempts=1" in listed[0], listed[0]
    assert "inv-005-negative.json" not in listed[1] and "2 file(s) in error/" in listed[1]
    assert "INV-5" in listed[2] and "http-422" in listed[2], listed[2]
    assert "0 of 0 dead letter(s) in fix.dead" in listed[3], listed[3]
    # The directory queue: INV-5 processed once, its replay recorded; the rest untouched.
    fix = tmp_path / "fix"
    assert sorted(p.name for p in (fix / "error").iterdir()) == ["inv-006-busy.json"]
    # The one given up on: deleted, its name (it has no id) in the purge's audit row.
    assert _rows(fix / "ledger.db", "SELECT op, ids, count FROM dead_ops WHERE op = 'purge'") == [
        ("purge", '["inv-008-no-id.json"]', 1)
    ]
    assert json.loads((fix / "done" / "inv-005-negative.json").read_text())["total"] == 5
    assert _rows(fix / "ledger.db", "SELECT count(*) FROM messages WHERE msg_id = 'INV-5'") == [
        (1,)
    ]
    assert _rows(fix / "ledger.db", "SELECT ref, msg_id FROM replays") == [
        ("inv-005-negative.json", "INV-5")
    ]
    # RabbitMQ: the body shown, corrected and replayed; processed; nothing left dead.
    assert json.loads((tmp_path / "inv-5.json").read_text()) == {
        "invoiceId": "INV-5",
        "customer": "Umbrella",
        "total": 5,
    }
    db = tmp_path / "fix.db"
    assert _rows(db, "SELECT msg_id FROM messages") == [("INV-5",)]
    ((op, filt, count, finished),) = _rows(
        db, "SELECT op, filter, count, finished_at FROM dead_ops"
    )
    assert (op, count, finished is not None) == ("replay", 1, True)
    assert json.loads(filt)["ids"] == ["INV-5"]
    assert json.loads(filt)["body"]["file"] == "inv-5.json"
    depths = queues(amqp_url)
    assert (depths["fix.in"][0], depths["fix.dead"][0]) == (0, 0), depths


def _the_shared_ledger_did_what_the_readme_says(
    tmp_path: Path, out: dict[str, str], pg_url: str
) -> None:
    """'A shared PostgreSQL ledger': both queues recorded in PostgreSQL, none in a file."""
    import psycopg

    with psycopg.connect(pg_url) as conn:
        counts = dict(
            conn.execute("SELECT flow, count(*) FROM onceq.messages GROUP BY flow").fetchall()
        )
        ops = conn.execute("SELECT transport, op, count FROM onceq.dead_ops").fetchall()
    assert counts == {"default": 15, "orders-shared": 16}, counts
    assert ops == [("dirq", "replay", 1)], ops
    assert not (tmp_path / "pgq" / "ledger.db").exists()
    assert not (tmp_path / "pgq2" / "ledger.db").exists()
    assert sorted(p.name for p in (tmp_path / "pgq" / "error").iterdir()) == ["msg-009.json"]
    assert "OK" in out['onceq dirq order-check --db "$DATABASE_URL"']
    checked = out["onceq check shared.toml"]
    assert checked.rstrip().endswith(f"ledger {pg_url.replace('postgres@', 'postgres:***@')}")


def _rows(db: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def _dead(db: Path, flow: str) -> list[object]:
    """The reasons of a flow's dead letters (quarantined files), sorted."""
    sql = "SELECT reason FROM failures WHERE flow = ? AND action = 'dead' ORDER BY reason"
    with sqlite3.connect(db) as conn:
        return [r[0] for r in conn.execute(sql, (flow,))]


def _your_own_flow_did_what_the_readme_says(
    tmp_path: Path, out: dict[str, str], amqp_url: str
) -> None:
    """'Your own flow': the invoice example, three ways, each on both transports."""
    new = [("INV 7/A",), ("INV-1",), ("INV-2",), ("INV-3",)]
    # With flags, the directory queue: 4 processed, 1 duplicate, 3 quarantined.
    inv = tmp_path / "inv"
    assert sorted(p.name for p in (inv / "error").iterdir()) == [
        "inv-005-negative.json",
        "inv-006-busy.json",
        "inv-008-no-id.json",
    ]
    assert len(list((inv / "done").iterdir())) == 5
    assert _rows(inv / "ledger.db", "SELECT msg_id FROM messages WHERE flow = 'invoices'"
                 " ORDER BY msg_id") == new  # fmt: skip
    assert _rows(inv / "ledger.db", "SELECT json_extract(kept, '$.total') FROM messages"
                 " WHERE msg_id = 'INV-1'") == [(120.5,)]  # fmt: skip
    assert _dead(inv / "ledger.db", "invoices") == ["http-422", "http-503", "missing-field"]
    consumed = next(v for k, v in out.items() if k.startswith("onceq dirq consume ./inv "))
    assert "4 processed, 1 duplicates" in consumed and "3 quarantined" in consumed, consumed
    # With flags, RabbitMQ: the partner had them all (409 = done, a partner duplicate);
    # the re-sent copy a duplicate; the negative and the BUSY invoice dead.
    db = tmp_path / "invoices.db"
    assert _rows(db, "SELECT msg_id, partner_duplicate FROM messages ORDER BY msg_id") == [
        (i, 1) for (i,) in new
    ]
    assert _dead(db, "invoices") == ["http-422", "http-503"]
    consumed = next(v for k, v in out.items() if k.startswith("onceq mq consume --queue"))
    assert "1 duplicates, 4 partner_duplicates" in consumed, consumed
    # The flow file: two flows, one ledger, each its own dedup; the secret never shown.
    db = tmp_path / "flows.db"
    assert _rows(db, "SELECT msg_id FROM messages WHERE flow = 'invoices-files'"
                 " ORDER BY msg_id") == new  # fmt: skip
    assert _rows(db, "SELECT count(*) FROM messages WHERE flow = 'invoices-queue'") == [(0,)]
    assert _dead(db, "invoices-files") == ["http-422", "http-503", "missing-field"]
    assert _dead(db, "invoices-queue") == ["http-422", "http-503"]
    assert not any("s3cr3t" in text for text in out.values())
    # Python: one flow over both transports; the invoices table written once per invoice.
    db = tmp_path / "py.db"
    assert _rows(db, "SELECT id FROM invoices ORDER BY id") == new
    assert _rows(db, "SELECT DISTINCT source FROM messages") == [("dirq",)]
    assert _dead(db, "invoices") == sorted(
        ["http-422", "http-503", "missing-field", "http-422", "http-503"]
    )
    assert out[".venv/bin/python invoices_app.py ./inv3"].startswith(
        "4 processed, 0 partner duplicates, 1 duplicates, 3 dead"
    )
    assert out[".venv/bin/python invoices_app.py invoice.in"].startswith(
        "0 processed, 0 partner duplicates, 4 duplicates, 2 dead"
    )
    # Every dead letter of the three RabbitMQ runs is in invoice.dead, none left behind.
    depths = queues(amqp_url)
    assert (depths["invoice.in"][0], depths["invoice.dead"][0]) == (0, 6), depths


def test_mq_doc_examples_run_as_written(tmp_path: Path, amqp_url: str) -> None:
    ran = run_examples("docs/mq.md", tmp_path, amqp_url)
    consumed = next(s for ex, s in ran if ex.command.startswith("onceq mq consume"))
    stats = json.loads(consumed)
    stats = stats.get("stats", stats)
    # The page's claim: 6 processed, 1 duplicate, the no-docs and the BUSY claim dead.
    assert (stats["processed"], stats["duplicates"], stats["dead"]) == (6, 1, 2), stats
    invoices = next(s for ex, s in ran if ex.command.startswith("onceq mq consume --queue"))
    assert "1 received, 1 processed" in invoices, invoices
    # Retries: the always-busy claim, tried at once, again at once, after 1 s, after
    # 2 s (3 retries, each a requeue or a copy through its tier), then dead.
    tiers = next(s for ex, s in ran if "--retry-delays 1s,2s --until-empty" in ex.command)
    tiers_stats = json.loads(tiers)
    assert (tiers_stats["requeued"], tiers_stats["dead"]) == (3, 1), tiers_stats
    assert tiers_stats["drained"] is True
    assert _rows(
        tmp_path / "processed.db",
        "SELECT attempt, action FROM failures WHERE msg_id = 'busy-2' ORDER BY id",
    ) == [(1, "requeue"), (2, "delay"), (3, "delay"), (4, "dead")]


def test_api_doc_examples_run_as_written(tmp_path: Path, amqp_url: str) -> None:
    """docs/api.md: the invoice flow's own test passes, and the runs book each invoice once."""
    ran = run_examples("docs/api.md", tmp_path, amqp_url)
    out = {ex.line.split("#")[0].strip(): stdout for ex, stdout in ran}
    assert "1 passed" in out[".venv/bin/python -m pytest -q test_invoices_flow.py"]
    ran_flow = out[".venv/bin/python invoices_flow.py ./inv"]
    assert ran_flow.startswith("4 processed, 1 duplicates, 3 dead"), ran_flow
    new = [("INV 7/A",), ("INV-1",), ("INV-2",), ("INV-3",)]
    db = tmp_path / "ledger.db"
    assert _rows(db, "SELECT id FROM invoices ORDER BY id") == new
    assert _dead(db, "invoices") == ["missing-field", "rejected", "retry"]
    # The flow file: the same functions, its own ledger; the partner answered 409 to the
    # 4 it had, which `post` takes as done.
    ran_file = out["onceq run invoices.toml --until-empty"]
    assert "4 processed, 1 duplicates" in ran_file and "3 quarantined" in ran_file, ran_file
    assert _rows(tmp_path / "flows.db", "SELECT id FROM invoices ORDER BY id") == new
