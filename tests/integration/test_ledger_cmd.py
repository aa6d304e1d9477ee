"""`onceq ledger prune|stats` on both ledgers, as a user runs them: what is reported is
what went, a dry run and a refused run change nothing, the floor comes from the flow
file's retry policies, a missing ledger is exit 3 and never created, mistakes are one
line, and a URL's password is never printed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli_support import invoke
from mq_support import wait_for
from onceq._ledger.retention import TABLE_NAMES, stats
from onceq._ledger.target import is_pg_url, open_ledger
from pg_support import create_database, drop_database
from retention_support import OLD, backdate, fill, newest_rows_are_new, ok, rows
from support import run_cli


def _json(r: Any) -> Any:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _one_line(r: Any, code: int) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onceq: "), r.stderr
    return lines[0]


def _all_rows(target: str) -> dict[str, set[tuple[Any, ...]]]:
    with open_ledger(target, flow="a", create=False) as led:
        return rows(led)


def test_prune_reports_what_it_removed_per_table_and_flow(ledger_target: str) -> None:
    gone = {"a": fill(ledger_target, "a"), "b": fill(ledger_target, "b")}
    newest_rows_are_new(ledger_target)
    before = _all_rows(ledger_target)
    dry = _json(
        invoke(
            "ledger", "prune", "--older-than", "30d", "--db", ledger_target, "--dry-run", "--json"
        )
    )
    assert _all_rows(ledger_target) == before
    assert dry["dry_run"] is True
    out = _json(
        invoke(
            "ledger",
            "prune",
            "--older-than",
            "30d",
            "--db",
            ledger_target,
            "--json",
            "--batch",
            "2",
        )
    )
    after = _all_rows(ledger_target)
    for t in TABLE_NAMES:
        assert before[t] - after[t] == gone["a"][t] | gone["b"][t], t
        assert out["removed"][t] == {"a": len(gone["a"][t]), "b": len(gone["b"][t]), "c": 0}
    assert out["removed"] == dry["removed"]
    assert out["total"] == sum(len(g[t]) for g in gone.values() for t in TABLE_NAMES)
    assert out["older_than_s"] == 30 * 86400.0 and out["dry_run"] is False
    # the human report: one line per table and flow, the same figures
    again = invoke("ledger", "prune", "--older-than", "30d", "--db", ledger_target, "--flow", "a")
    assert again.returncode == 0, again.stderr
    assert "removed 0 rows older than" in again.stdout
    assert [ln.split() for ln in again.stdout.splitlines()[2:]] == [
        [t, "a", "0"] for t in TABLE_NAMES
    ]


def test_a_window_under_the_longest_retry_delay_is_refused_and_changes_nothing(
    ledger_target: str, tmp_path: Path
) -> None:
    fill(ledger_target, "slow")
    fill(ledger_target, "a")
    before = _all_rows(ledger_target)
    r = invoke("ledger", "prune", "--older-than", "5m", "--db", ledger_target)
    line = _one_line(r, 2)
    assert "--older-than 5m: shorter than the longest retry delay (10m" in line
    assert "nothing pruned (--force" in line
    # the flow file's policies: `slow` waits 2 h in its last tier
    flows = tmp_path / "flows.toml"
    flows.write_text(
        'ledger = "./ledger.db"\n[flows.slow]\nsource = "dirq"\npath = "./q"\n'
        'id_field = "msg_id"\n[flows.slow.http]\nurl = "http://127.0.0.1:9/x"\n'
        '[flows.slow.retry]\ndelays = ["5s", "2h"]\n'
    )
    base = ("ledger", "prune", "--older-than", "1h", "--db", ledger_target, "--flows", str(flows))
    line = _one_line(invoke(*base), 2)
    assert "(2h, flow slow)" in line
    line = _one_line(invoke(*base, "--flow", "slow", "--json"), 2)
    assert "(2h, flow slow)" in line
    assert _all_rows(ledger_target) == before
    # another flow of that ledger has the default's floor (10 min): 1 h is allowed
    out = _json(invoke(*base, "--flow", "a", "--json"))
    assert out["removed"]["messages"] == {"a": 5}
    out = _json(invoke(*base, "--flow", "slow", "--force", "--json"))
    assert out["removed"]["messages"] == {"slow": 5}


def test_stats_prints_the_rows_counted(ledger_target: str) -> None:
    fill(ledger_target, "a")
    fill(ledger_target, "b")
    out = _json(invoke("ledger", "stats", "--db", ledger_target, "--json"))
    with open_ledger(ledger_target, flow="a", create=False) as led:
        assert out == json.loads(json.dumps(stats(led)))  # the library's figures, as JSON
        for t in TABLE_NAMES:
            for flow in ("a", "b"):
                n = led._q1(f"SELECT count(*) FROM {t} WHERE flow = ?", (flow,))[0]
                assert out["tables"][t]["flows"][flow]["rows"] == n
    assert out["size_bytes"] > 0
    human = invoke("ledger", "stats", "--db", ledger_target)
    assert human.returncode == 0, human.stderr
    lines = [ln.split() for ln in human.stdout.splitlines()]
    assert lines[2][:3] == ["messages", "(all)", "16"]
    assert lines[3][:3] == ["messages", "a", "8"]


def test_a_missing_ledger_is_exit_3_and_is_not_created(tmp_path: Path, pg_url: str) -> None:
    missing = tmp_path / "no-ledger.db"
    for args in (("stats",), ("prune", "--older-than", "30d")):
        line = _one_line(invoke("ledger", *args, "--db", str(missing)), 3)
        assert str(missing) in line
        assert not missing.exists()
        _one_line(invoke("ledger", *args, "--db", pg_url), 3)
        import psycopg

        with psycopg.connect(pg_url) as conn:
            found = conn.execute(
                "SELECT count(*) FROM pg_namespace WHERE nspname = 'onceq'"
            ).fetchone()
        assert found == (0,)


@pytest.mark.parametrize(
    "argv",
    [
        ["prune", "--older-than", "3x", "--db", "L"],
        ["prune", "--older-than", "30d", "--db", "L", "--flow", "no/such"],
        ["prune", "--older-than", "30d", "--db", "L", "--batch", "0"],
        ["prune", "--db", "L"],
        ["prune", "--older-than", "30d"],
        ["stats"],
        ["stats", "--db", "L", "--flows", "nowhere.toml"],
    ],
    ids=" ".join,
)
def test_mistakes_are_one_line_exit_2_and_change_nothing(argv: list[str], tmp_path: Path) -> None:
    target = str(tmp_path / "ledger.db")
    fill(target, "a")
    before = _all_rows(target)
    r = invoke("ledger", *[target if a == "L" else a for a in argv], env={"EAI_MQ_DB": ""})
    _one_line(r, 2)
    assert r.stdout == ""
    assert _all_rows(target) == before


def test_eai_mq_db_names_the_ledger(tmp_path: Path) -> None:
    target = str(tmp_path / "ledger.db")
    fill(target, "a")
    out = _json(invoke("ledger", "stats", "--json", env={"EAI_MQ_DB": target}))
    assert out["ledger"] == target and out["tables"]["messages"]["rows"] == 8


def test_a_url_password_is_never_printed() -> None:
    url = create_database()
    secret_url = url.replace("postgres@", "postgres:s3cret@")
    try:
        assert is_pg_url(secret_url)
        fill(url, "a")
        runs = [
            invoke("ledger", "stats", "--db", secret_url),
            invoke("ledger", "stats", "--db", secret_url, "--json"),
            invoke("ledger", "prune", "--older-than", "30d", "--db", secret_url, "--dry-run"),
            invoke("ledger", "prune", "--older-than", "30d", "--db", secret_url, "--json"),
            invoke("ledger", "prune", "--older-than", "1m", "--db", secret_url),  # refused
            # a database that does not exist: the driver's own error text
            invoke("ledger", "stats", "--db", secret_url.rsplit("/", 1)[0] + "/no_such_db"),
            invoke("ledger", "stats", "--db", "postgresql://postgres:s3cret@127.0.0.1:1/x"),
        ]
        for r in runs:
            assert "s3cret" not in r.stdout + r.stderr, (r.args, r.stdout, r.stderr)
        assert [r.returncode for r in runs][:5] == [0, 0, 0, 0, 2]
        assert runs[5].returncode in (3, 8) and runs[6].returncode == 8
        assert "postgres:***@" in runs[0].stdout
        assert json.loads(runs[1].stdout)["ledger"].startswith("postgresql://postgres:***@")
    finally:
        drop_database(url)


def test_prune_shows_its_progress_on_a_terminal_only(tmp_path: Path) -> None:
    from test_progress import CLEAR, run_in_pty

    target = str(tmp_path / "ledger.db")
    with open_ledger(target, flow="a") as led:
        led.commit([ok(f"m-{i:05}") for i in range(200)])
        backdate(led, "messages", "processed_at", "flow = ?", ("a",))
    args = ("ledger", "prune", "--older-than", "30d", "--db", target, "--batch", "1")
    code, screen = run_in_pty(*args, "--dry-run")
    assert code == 0 and "pruning" not in screen  # a dry run only counts: nothing to show
    code, screen = run_in_pty(*args)
    assert code == 0, screen
    assert re.search(r"pruning messages of flow a: \d+ removed · \d+s", screen), screen
    assert CLEAR in screen and "removed 200 rows older than" in screen
    fill(target, "b")
    piped = run_cli(*args)
    assert piped.returncode == 0 and piped.stderr == ""


def test_a_prune_killed_midway_leaves_a_sound_ledger_and_a_second_one_finishes(
    ledger_target: str,
) -> None:
    """kill -9 between (or inside) batches: every batch is a transaction, so what is
    left is what a full prune leaves minus the batches not yet run; a second prune
    removes exactly those, and what must stay stayed."""
    gone = fill(ledger_target, "a")
    newest_rows_are_new(ledger_target)
    n_old = 6000
    with open_ledger(ledger_target, flow="a") as led:
        led.commit([ok(f"x-{i:05}") for i in range(n_old)])
        backdate(led, "messages", "processed_at", "msg_id LIKE ?", ("x-%",))
    before = _all_rows(ledger_target)
    proc = subprocess.Popen(
        [sys.executable, "-m", "onceq", "ledger", "prune", "--older-than", "30d",
         "--db", ledger_target, "--batch", "5"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    old = "SELECT count(*) FROM messages WHERE msg_id LIKE ?"

    def left() -> int:
        with open_ledger(ledger_target, flow="a", create=False) as led:
            return int(led._q1(old, ("x-%",))[0])

    wait_for(lambda: left() < n_old - 500, timeout=60)
    proc.kill()
    proc.wait()
    assert 0 < left() < n_old - 500  # killed midway
    with open_ledger(ledger_target, flow="a", create=False) as led:
        still_old = int(led._q1("SELECT count(*) FROM messages WHERE processed_at = ?", (OLD,))[0])
    out = _json(invoke("ledger", "prune", "--older-than", "30d", "--db", ledger_target, "--json"))
    after = _all_rows(ledger_target)
    for t in TABLE_NAMES:
        extra = {("a", f"x-{i:05}") for i in range(n_old)} if t == "messages" else set()
        assert before[t] - after[t] == gone[t] | extra, t
    assert out["removed"]["messages"]["a"] == still_old
    with open_ledger(ledger_target, flow="a", create=False) as led:
        assert led.failed_attempts("a-waiting") == 2 and led.failed_attempts("a-replayed") == 1
