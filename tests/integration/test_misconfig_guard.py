"""The misconfiguration guard and the all-failed exit over a directory queue, as a user
meets them: real `onceq` processes, real folders, the inbox counted afterwards.

- a typo'd --id-field over 1,000 invoices: at most the threshold leave inbox/, one
  line names the missing field and the fields the files have, exit 10;
- a small batch that only fails (or any, with --no-guard) exits 11; a mixed one 0;
- the exercise's orders preset and the lab's consume.py keep the exercise's rule:
  every bad file quarantined, the run goes on, exit 0;
- a flow file's `guard` key and `onceq run` (10, 11), the flags' mistakes (exit 2).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from cli_support import invoke
from mq_stub import Script, scripted_partner
from support import plain_env, run_cli

TYPO = ("--id-field", "invoice_id")  # the invoices' id is invoiceId


def invoices(folder: Path, n: int, start: int = 0) -> Path:
    """n invoices shaped like the built-in sample's (invoiceId, customer, total)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(start, start + n):
        doc = {"invoiceId": f"INV-{i}", "customer": "ACME", "total": 120.5 + i}
        (folder / f"inv-{i:05d}.json").write_text(json.dumps(doc))
    return folder


def queue(tmp_path: Path, n: int, name: str = "q") -> Path:
    q = tmp_path / name
    r = invoke("dirq", "init", str(q), "--from", str(invoices(tmp_path / f"{name}-src", n)))
    assert r.returncode == 0, r.stderr
    return q


def count(q: Path, folder: str) -> int:
    if folder == "processing":  # claimed files, in every worker folder
        return sum(len(files) - (".lock" in files) for _, _, files in os.walk(q / folder))
    return len([n for n in os.listdir(q / folder) if n.endswith(".json")])


def last_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert lines, "no line on stderr"
    return lines[-1]


def test_a_typod_id_field_stops_after_ten_of_a_thousand_files(tmp_path: Path) -> None:
    q = queue(tmp_path, 1000)
    r = invoke("dirq", "consume", str(q), *TYPO)
    assert r.returncode == 10, r.stderr
    assert count(q, "error") == 10 and count(q, "inbox") == 990, r.stdout
    assert count(q, "processing") == 0 and count(q, "done") == 0
    line = last_line(r.stderr)
    assert line.startswith(f"onceq: {q}: misconfigured? the first 10 message(s)"), line
    assert "no message has the id field invoice_id" in line, line
    assert "(the fields they have: customer, invoiceId, total)" in line, line
    assert "ACME" not in r.stderr and "INV-" not in r.stderr  # keys, never values
    assert "10 quarantined (missing-field 10)" in r.stdout
    # Fixed, the next run takes the rest, and the ten are a replay away (error/).
    again = invoke("dirq", "consume", str(q), "--id-field", "invoiceId")
    assert again.returncode == 0, again.stderr
    assert count(q, "done") == 990 and count(q, "error") == 10


def test_several_workers_share_the_first_n(tmp_path: Path) -> None:
    """--workers 3: the first 10 of the whole run, plus at most one verdict per other
    worker that was being reached when the first one tripped (docs/architecture.md)."""
    q = queue(tmp_path, 1000)
    # A process of its own: --workers forks, and a fork of the test process is no user's.
    r = run_cli("dirq", "consume", str(q), *TYPO, "--workers", "3", "--json")
    assert r.returncode == 10, r.stderr
    assert 10 <= count(q, "error") <= 10 + 2, count(q, "error")
    assert count(q, "inbox") + count(q, "error") == 1000 and count(q, "processing") == 0
    out = json.loads(r.stdout)
    assert out["quarantined"] == count(q, "error") and "invoice_id" in out["misconfigured"]


def test_a_small_batch_that_only_failed_exits_11_and_a_mixed_one_0(tmp_path: Path) -> None:
    small = queue(tmp_path, 5, "small")
    r = invoke("dirq", "consume", str(small), *TYPO)
    assert r.returncode == 11, r.stderr
    assert last_line(r.stderr) == (
        f"onceq: {small}: every message failed: 5 quarantined (missing-field 5)"
    )
    assert count(small, "error") == 5
    off = queue(tmp_path, 30, "off")
    r = invoke("dirq", "consume", str(off), *TYPO, "--no-guard")
    assert r.returncode == 11, r.stderr
    assert count(off, "error") == 30 and count(off, "inbox") == 0
    mixed = queue(tmp_path, 20, "mixed")
    (mixed / "inbox" / "inv-00003.json").write_text('{"other": 1}')
    r = invoke("dirq", "consume", str(mixed), "--id-field", "invoiceId")
    assert r.returncode == 0, r.stderr
    assert (count(mixed, "done"), count(mixed, "error")) == (19, 1)


def test_guard_failures_sets_the_threshold_and_a_contradiction_is_refused(
    tmp_path: Path,
) -> None:
    q = queue(tmp_path, 50)
    r = invoke("dirq", "consume", str(q), *TYPO, "--guard-failures", "3")
    assert r.returncode == 10, r.stderr
    assert count(q, "error") == 3 and count(q, "inbox") == 47
    before = sorted(os.listdir(q / "inbox"))
    r = invoke("dirq", "consume", str(q), *TYPO, "--no-guard", "--guard-failures", "3")
    assert r.returncode == 2
    assert r.stderr.splitlines() == ["onceq: --guard-failures: the guard is off (--no-guard)"]
    assert sorted(os.listdir(q / "inbox")) == before


def test_a_partner_that_refuses_the_credentials_stops_the_run(tmp_path: Path) -> None:
    """401 on every call: stopped after 10 verdicts plus the calls already under way
    (2 x the effect's concurrency of 5 held at once: at most 10 + 9)."""
    q = queue(tmp_path, 200)
    with scripted_partner(Script(default=401)) as base:
        url = base.replace("http://", "http://svc:pa55w0rd@") + "/api/invoices"
        r = invoke("dirq", "consume", str(q), "--id-field", "invoiceId", "--url", url)
    assert r.returncode == 10, r.stderr
    assert 10 <= count(q, "error") <= 19 and count(q, "inbox") + count(q, "error") == 200
    line = last_line(r.stderr)
    assert "refuses the credentials (401): check the token/headers" in line, line
    assert "pa55w0rd" not in r.stderr + r.stdout and "svc:***@" in line


def test_the_orders_preset_quarantines_every_bad_file_and_exits_0(tmp_path: Path) -> None:
    """The exercise's rule (seed 000): bad files go to error/, the run goes on."""
    q = queue(tmp_path, 40)  # invoices: none is an order, every one lacks msg_id …
    r = invoke("dirq", "consume", str(q))
    assert r.returncode == 0, r.stderr
    assert count(q, "error") == 40 and count(q, "inbox") == 0
    assert r.stdout.startswith("every message failed: 40 quarantined")


def test_the_labs_consume_py_keeps_the_exercises_rule(tmp_path: Path) -> None:
    root = tmp_path / "R"
    r = invoke("lab", "fileq", "--root", str(root), "--no-run")
    assert r.returncode == 0, r.stderr
    q = root / "q"
    for f in os.listdir(q / "inbox"):
        os.unlink(q / "inbox" / f)
    invoices(q / "inbox", 25)
    run = subprocess.run(
        [str(q / "consume.py")], capture_output=True, text=True, timeout=120, env=plain_env()
    )
    assert run.returncode == 0, run.stderr
    assert count(q, "error") == 25 and count(q, "inbox") == 0


# --- flow files -----------------------------------------------------------------------


def flow_file(tmp_path: Path, q: Path, extra: str = "") -> Path:
    f = tmp_path / "flows.toml"
    f.write_text(
        f'ledger = "ledger.db"\n\n[flows.invoices]\nsource = "dirq"\npath = "{q}"\n'
        f'id_field = "invoice_id"\n{extra}'
    )
    return f


def test_onceq_run_stops_a_misconfigured_flow_with_10(tmp_path: Path) -> None:
    q = queue(tmp_path, 300)
    r = invoke("run", str(flow_file(tmp_path, q)), "--until-empty")
    assert r.returncode == 10, r.stderr
    line = last_line(r.stderr)
    assert line.startswith("onceq: flow invoices: misconfigured? the first 10"), line
    assert count(q, "error") == 10 and count(q, "inbox") == 290


def test_a_flow_files_guard_key(tmp_path: Path) -> None:
    q = queue(tmp_path, 30)
    f = flow_file(tmp_path, q, "guard = false\n")
    assert "no guard" in invoke("check", str(f)).stdout
    r = invoke("run", str(f), "--until-empty")
    assert r.returncode == 11, r.stderr
    assert last_line(r.stderr) == (
        "onceq: flow invoices: every message failed: 30 quarantined (missing-field 30)"
    )
    assert count(q, "error") == 30
    q2 = queue(tmp_path, 30, "q2")
    f = flow_file(tmp_path, q2, "[flows.invoices.guard]\nfailures = 4\n")
    assert "guard 4" in invoke("check", str(f)).stdout
    r = invoke("run", str(f), "--until-empty")
    assert r.returncode == 10 and count(q2, "error") == 4, r.stderr


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("guard = 3", "flows.invoices.guard: must be a table or true/false, not an integer"),
        ("guard = { failures = 0 }", "flows.invoices.guard.failures: must be 1-100000, not 0"),
        ("guard = { every = 2 }", "flows.invoices.guard.every: unknown key"),
    ],
)
def test_a_wrong_guard_key_is_one_line_and_exit_2(tmp_path: Path, value: str, why: str) -> None:
    f = flow_file(tmp_path, tmp_path / "q", value + "\n")
    r = invoke("check", str(f))
    assert r.returncode == 2
    assert any(why in line for line in r.stderr.splitlines()), r.stderr
