"""What a user can rely on across commands: one exit code per situation, one rule for
signals, a summary that says when everything failed, output that a pipe can read, and
the same words in JSON and in the human lines. Real processes throughout."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from cli_support import init_queue, invoke
from mq_support import (
    CLAIMS,
    EXERCISE,
    claim_doc,
    cli,
    partner,
    publish,
    topology,
    wait_for,
    write_claims,
)
from support import SAMPLE, plain_env, run_cli, snapshot

# --- 1. one exit code per situation ---------------------------------------------------


# Each case: (what is missing, argv built from (tmp_path, an existing queue)).
Argv = Callable[[Path, Path], list[str]]
MISSING: dict[str, tuple[str, Argv]] = {
    "consume: no queue folder": ("q-none", lambda t, q: ["dirq", "consume", str(t / "q-none")]),
    "schema: no queue folder": ("q-none", lambda t, q: ["dirq", "schema", str(t / "q-none")]),
    "report: no queue folder": ("q-none", lambda t, q: ["dirq", "report", str(t / "q-none")]),
    "replay: no queue folder": (
        "q-none",
        lambda t, q: ["dirq", "replay", str(t / "q-none"), "msg-001.json"],
    ),
    "order-check: no queue folder": (
        "q-none",
        lambda t, q: ["dirq", "order-check", str(t / "q-none")],
    ),
    "consume: a file, not a queue folder": (
        "msg-001.json",
        lambda t, q: ["dirq", "consume", str(q / "inbox" / "msg-001.json")],
    ),
    "report: no ledger": ("ledger.db", lambda t, q: ["dirq", "report", str(q)]),
    "order-check: no ledger": ("ledger.db", lambda t, q: ["dirq", "order-check", str(q)]),
    "order-check --db: no ledger": (
        "none.db",
        lambda t, q: ["dirq", "order-check", "--db", str(t / "none.db")],
    ),
    "order-check --sql: no file": (
        "none.sql",
        lambda t, q: [
            "dirq",
            "order-check",
            "--db",
            str(t / "none.db"),
            "--sql",
            str(t / "none.sql"),
        ],
    ),
    "replay: no file in error/": (
        "nope.json",
        lambda t, q: ["dirq", "replay", str(q), "nope.json"],
    ),
    "schema -o: no folder": (
        "no-dir",
        lambda t, q: ["dirq", "schema", str(q), "-o", str(t / "no-dir" / "s.csv")],
    ),
    "init --from: no folder": (
        "src-none",
        lambda t, q: ["dirq", "init", str(t / "q2"), "--from", str(t / "src-none")],
    ),
    "lab fileq --fixtures: no folder": (
        "fx-none",
        lambda t, q: ["lab", "fileq", "--root", str(t / "R"), "--fixtures", str(t / "fx-none")],
    ),
    "mq publish: no file": (
        "none.json",
        lambda t, q: ["mq", "publish", str(CLAIMS / "claim-001.json"), str(t / "none.json")],
    ),
}


@pytest.mark.parametrize("case", sorted(MISSING))
def test_anything_missing_is_exit_3_in_one_line_and_changes_nothing(
    case: str, tmp_path: Path
) -> None:
    name, argv = MISSING[case]
    q = init_queue(tmp_path / "q", SAMPLE)
    before = snapshot(tmp_path)
    # The broker URL points nowhere: a refusal must come before any connection.
    r = invoke(*argv(tmp_path, q), env={"EAI_AMQP_URL": "amqp://guest:guest@127.0.0.1:1/"})
    assert r.returncode == 3, (r.returncode, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("onceq: ") and name in lines[0], r.stderr
    assert r.stdout == ""
    assert snapshot(tmp_path) == before


def test_lag_keeps_its_monitor_contract_2_for_a_missing_folder(tmp_path: Path) -> None:
    for path in (tmp_path / "none", init_queue(tmp_path / "q", SAMPLE) / "inbox" / "msg-001.json"):
        r = invoke("dirq", "lag", str(path), "5")
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.splitlines()) == 1 and str(path) in r.stderr
    help_text = invoke("dirq", "lag", "--help").stdout
    assert "2 for any bad argument" in help_text and "no such queue folder" in help_text


@pytest.mark.broker
@pytest.mark.parametrize(
    "argv",
    [["mq", "status"], ["mq", "topology"], ["mq", "publish", str(CLAIMS / "claim-001.json")],
     ["mq", "consume", "--claim", "http://127.0.0.1:9"]],
    ids=lambda a: a[1],
)  # fmt: skip
def test_a_missing_vhost_is_exit_7_in_one_line_in_every_mq_command(
    amqp_url: str, tmp_path: Path, argv: list[str]
) -> None:
    """One situation, one code: rabbitmqctl could tell status 'no such vhost' (3), but
    the AMQP handshake cannot tell a missing vhost from a forbidden one, so topology,
    publish and consume say 7; status says 7 too rather than differ."""
    gone = amqp_url + "-gone"
    r = (
        cli(gone, *argv, "--db", str(tmp_path / "x.db"))
        if argv[1] == "consume"
        else cli(gone, *argv)
    )
    assert r.returncode == 7, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("onceq: "), r.stderr
    assert "-gone' does not exist" in lines[0]
    assert r.stdout == "" and list(tmp_path.iterdir()) == []


# --- 2. one rule for signals ----------------------------------------------------------


def test_the_signal_rule_is_in_the_help_of_both_consumers() -> None:
    dirq = " ".join(invoke("dirq", "consume", "--help").stdout.split())
    mq = " ".join(invoke("mq", "consume", "--help").stdout.split())
    top = " ".join(invoke("--help").stdout.split())
    assert "exits 130 (SIGINT) or 143 (SIGTERM)" in dirq
    assert "SIGTERM, SIGINT or --max-seconds" in mq and "exit 0" in mq
    assert "runs until it is stopped (mq consume) exits 0" in top
    assert "(dirq consume, mq consume --until-empty) exits 130/143" in top


@pytest.mark.broker
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_exercise_consumer_py_exits_0_on_a_stop_signal(
    amqp_url: str, tmp_path: Path, sig: signal.Signals
) -> None:
    """The exercise's own command (python3 consumer.py, the venv not activated)."""
    from onceq._exercise.lab.mq import write_layout

    d = write_layout(tmp_path)
    topology(amqp_url)
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc(f"sig-{i}") for i in range(20)]))
    env = plain_env({"EAI_AMQP_URL": amqp_url, "EAI_MQ_DB": str(tmp_path / "p.db")})
    with partner(delay=0.3) as p:
        proc = subprocess.Popen(
            ["python3", str(d / "consumer.py"), "--claim", p.url, "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        wait_for(lambda: p.stats()["total"] >= 3, timeout=30)  # claims in flight now
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert 3 <= summary["processed"] < 20


# --- 3. a run in which everything failed says so --------------------------------------


def _bad_files(folder: Path, n: int) -> Path:
    folder.mkdir()
    for i in range(n):
        (folder / f"bad-{i}.json").write_text("{not json")
    return folder


def test_a_dirq_run_where_every_message_failed_says_so_first(tmp_path: Path) -> None:
    src = _bad_files(tmp_path / "bad", 3)
    q1, q2 = init_queue(tmp_path / "q1", src), init_queue(tmp_path / "q2", src)
    human = invoke("dirq", "consume", str(q1))
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert lines[0] == "every message failed: 3 quarantined (parse 3)", lines
    as_json = json.loads(invoke("dirq", "consume", str(q2), "--json").stdout)
    assert as_json["all_failed"] is True
    assert as_json["quarantined"] == 3 and as_json["reasons"] == {"parse": 3}


def test_a_dirq_run_with_one_success_is_not_all_failed(tmp_path: Path) -> None:
    src = _bad_files(tmp_path / "bad", 3)
    shutil.copy(SAMPLE / "msg-001.json", src)
    q1, q2 = init_queue(tmp_path / "q1", src), init_queue(tmp_path / "q2", src)
    assert "every message failed" not in invoke("dirq", "consume", str(q1)).stdout
    assert json.loads(invoke("dirq", "consume", str(q2), "--json").stdout)["all_failed"] is False


@pytest.mark.broker
def test_an_mq_run_where_every_claim_failed_says_so_and_counts_dead_by_reason(
    amqp_url: str, tmp_path: Path
) -> None:
    """Two 422s and one 503 twice: 3 dead letters. The retry is not a fourth failure."""
    topology(amqp_url)
    docs = [claim_doc("n1", docs=[]), claim_doc("n2", docs=[]), claim_doc("b1", "BUSY-1")]
    files = write_claims(tmp_path / "c", docs)
    with partner() as p:
        publish(amqp_url, *files)
        # The exercise's rule: the 503 is requeued once, then dead (no delayed retry).
        args = ("mq", "consume", "--claim", p.url, "--max-seconds", "3", *EXERCISE)
        r = cli(amqp_url, *args, "--db", str(tmp_path / "a.db"), "--json")
        publish(amqp_url, *files)
        human = cli(amqp_url, *args, "--db", str(tmp_path / "b.db"))
    assert r.returncode == 0 and human.returncode == 0, r.stderr + human.stderr
    s = json.loads(r.stdout)
    assert s["all_failed"] is True
    assert (s["received"], s["dead"], s["requeued"]) == (4, 3, 1)
    assert s["reasons"] == {"http-422": 2, "http-503": 1}  # dead letters only
    assert s["requeued_reasons"] == {"http-503": 1}
    first = human.stdout.splitlines()[0]
    assert first == "every message failed: 3 dead (http-422 2, http-503 1)", human.stdout


# --- 4. output a pipe can read --------------------------------------------------------


def _long_dir(tmp_path: Path) -> Path:
    d = tmp_path / ("a-rather-long-folder-name-" * 5) / "queue [bold] with spaces"
    assert len(str(d)) > 100
    d.parent.mkdir(parents=True)
    return d


def test_piped_output_has_no_blank_first_line_and_no_wrapped_path(tmp_path: Path) -> None:
    long = _long_dir(tmp_path)
    q = init_queue(long, SAMPLE)
    demo, lab = long / "demo", long / "lab"
    outputs = {
        "dirq consume": run_cli("dirq", "consume", str(q)),
        "demo": run_cli("demo", "--dir", str(demo)),
        "lab fileq": run_cli("lab", "fileq", "--root", str(lab)),
    }
    for what, r in outputs.items():
        assert r.returncode == 0, (what, r.stderr)
        lines = r.stdout.splitlines()
        assert lines and lines[0].strip(), (what, r.stdout)
        assert not any(ln != ln.rstrip() for ln in lines), (what, r.stdout)  # no padding
    assert f"{q}: 20 received, 15 processed" in outputs["dirq consume"].stdout.splitlines()[0]
    assert any(f"Ledger: {demo}" in ln for ln in outputs["demo"].stdout.splitlines())
    assert f"through {demo}/" in outputs["demo"].stdout
    assert f"{lab / 'q'}: 20 received" in outputs["lab fileq"].stdout


@pytest.mark.broker
def test_mq_status_prints_the_watermark_as_text(amqp_url: str) -> None:
    topology(amqp_url)
    r = cli(amqp_url, "mq", "status")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].strip(), r.stdout
    assert "{'" not in r.stdout and "{" not in r.stdout, r.stdout
    [mem] = [ln for ln in lines if ln.startswith("memory high watermark: ")]
    assert re.fullmatch(
        r"memory high watermark: limit \d+ MiB, used \d+ MiB; alarms: .+",
        mem,
    ), mem


@pytest.mark.parametrize(
    ("mem", "line"),
    [
        ({"setting": {"absolute": 512 * 2**20}, "limit_bytes": 512 * 2**20, "alarms": []},
         "memory high watermark: absolute 512 MiB (limit 512 MiB); alarms: none"),
        ({"setting": {"relative": 0.4}, "used_bytes": 2**20, "alarms": [{"memory": "n@h"}]},
         "memory high watermark: relative 0.4 of RAM (used 1 MiB); alarms: memory n@h"),
        ({"setting": 0.4, "alarms": ["memory"]},
         "memory high watermark: relative 0.4 of RAM; alarms: memory"),
        ({"setting": {"odd": [1, 2]}}, "memory high watermark: odd 1, 2; alarms: none"),
        ({}, "memory high watermark: unknown; alarms: none"),
        # The management API's figures: no setting, a limit in bytes.
        ({"setting": None, "limit_bytes": 2**30, "used_bytes": 2**29, "alarms": ["memory"]},
         "memory high watermark: limit 1024 MiB, used 512 MiB; alarms: memory"),
        ({"limit_bytes": 2**30, "node": "rabbit@b", "nodes": 3, "alarms": ["memory on rabbit@b"]},
         "memory high watermark: limit 1024 MiB on rabbit@b (of 3 nodes; --node picks another);"
         " alarms: memory on rabbit@b"),
        ({"unknown": "needs the management API", "alarms": None},
         "memory high watermark: unknown (needs the management API)"),
    ],
)  # fmt: skip
def test_memory_line_never_prints_python_reprs(mem: dict, line: str) -> None:
    from onceq._cli.mq_status import memory_line

    assert memory_line(mem) == line


@pytest.mark.broker
def test_lab_mq_status_txt_has_no_terminal_escapes(amqp_url: str, tmp_path: Path) -> None:
    # The check means something only if rabbitmqctl does emit escapes into a pipe.
    raw = subprocess.run(
        ["rabbitmqctl", "-n", "rabbit@localhost", "status"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert "\x1b[" in raw
    r = run_cli("lab", "mq", "--root", str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "eaimw" / "mq" / "status.txt").read_text()
    assert "\x1b" not in text
    assert "\nRuntime\n" in text and "Memory high watermark setting" in text


# --- the same words in JSON and in the human lines -----------------------------------

PAIR = re.compile(r"(\d+) ([a-z]+)")


def _check_same_words(human: str, summary: dict) -> None:
    """Every `N word` of the human line is the JSON's `word: N`, and every non-zero
    count of the JSON is in the human line under its key."""
    counts = {k: v for k, v in summary.items() if isinstance(v, int) and not isinstance(v, bool)}
    outside = re.sub(r"\([^)]*\)", "", human)  # reasons are printed in parentheses
    pairs = PAIR.findall(outside)
    assert pairs, human
    for n, word in pairs:
        assert counts.get(word) == int(n), (word, n, summary)
    for k, v in counts.items():
        if v:
            assert f"{v} {k}" in human, (k, v, human)
    for reason, n in summary["reasons"].items():
        assert f"{reason} {n}" in human


def test_dirq_json_and_human_use_the_same_words(tmp_path: Path) -> None:
    q1, q2 = init_queue(tmp_path / "q1", SAMPLE), init_queue(tmp_path / "q2", SAMPLE)
    human = invoke("dirq", "consume", str(q1)).stdout.splitlines()[-1]
    summary = json.loads(invoke("dirq", "consume", str(q2), "--json").stdout)
    assert "dead" not in summary  # a directory queue quarantines; one word for it
    _check_same_words(human.replace(f"{q1}: ", ""), summary)


@pytest.mark.broker
def test_mq_json_and_human_use_the_same_words(amqp_url: str, tmp_path: Path) -> None:
    topology(amqp_url)
    claims = sorted(CLAIMS.glob("*.json"))
    with partner() as p:
        # The exercise's rule: the 503 is requeued once, then dead (no delayed retry).
        args = ("mq", "consume", "--claim", p.url, "--max-seconds", "3", *EXERCISE)
        publish(amqp_url, *claims)
        r = cli(amqp_url, *args, "--db", str(tmp_path / "a.db"), "--json")
        publish(amqp_url, *claims)
        human = cli(amqp_url, *args, "--db", str(tmp_path / "b.db"))
    summary = json.loads(r.stdout)
    assert "quarantined" not in summary
    line = human.stdout.splitlines()[-1]
    _check_same_words(line.split("; ledger ")[0], summary)
