"""A stop signal at any moment of a consumer's start follows the documented exit code.

README "Exit codes": a consumer that runs until stopped (`onceq run FILE`, `mq consume`)
exits 0 when SIGTERM/SIGINT stops it; a batch (`--until-empty`, `dirq consume`) exits
130/143 when stopped before it finished. Before onceq._core.early a signal that came while
the command imported, loaded its flows, bound its port or connected died of the
signal's default action (143 from a shell) whatever the rule said.

Real processes, real signals, sent 0 s to 0.8 s after onceq's first line (the moment
the process catches SIGTERM, read from /proc: before it Python itself is starting and
no program can take a signal; tests/unit/test_early_signal.py shows that moment is
the first line of onceq/__init__.py, before click, the flow file or asyncio). After
every run: each message is in exactly one place (nothing lost), no effect call was
made twice (nothing doubled), and a last run finishes what the stops left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from mq_support import partner, publish, queues, topology, write_claims
from support import run_cli

# From onceq's first line: at once, during the imports and the flow file, the port,
# the broker's connect or the ledger's open, and into consuming.
DELAYS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.8)
N = 300

EFFECT = """\
import asyncio, os

async def post(doc):
    await asyncio.sleep(0.05)
    with open(os.environ["FX_LOG"], "a") as f:
        f.write(doc["id"] + "\\n")
"""


def _catches_sigterm(pid: int) -> bool:
    """SigCgt in /proc/PID/status: the process has a handler for SIGTERM."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(x for x in status.splitlines() if x.startswith("SigCgt:")).split()[1], 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def _stopped_at(cmd: list[str], delay: float, sig: int, **kw: object) -> tuple[int, str]:
    """Start cmd, send `sig` `delay` s after it catches SIGTERM; its exit code and stderr."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)  # type: ignore[call-overload]
    deadline = time.monotonic() + 20
    while not _catches_sigterm(proc.pid):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "onceq never caught SIGTERM"
        time.sleep(0.0005)
    time.sleep(delay)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def _quiet(err: str) -> None:
    """No traceback and no library noise (an unretrieved task, an object's repr)."""
    for noise in ("Traceback", "Task exception was never retrieved", " at 0x", "never awaited"):
        assert noise not in err, err


def _expected(until_empty: bool, sig: int) -> int:
    return 128 + sig if until_empty else 0


def _no_call_twice(fx_log: Path) -> Counter[str]:
    calls = Counter(fx_log.read_text().split()) if fx_log.exists() else Counter()
    assert [k for k, n in calls.items() if n > 1] == [], "an effect was called twice"
    return calls


@pytest.fixture
def effect_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "slowfx.py").write_text(EFFECT)
    return {**os.environ, "PYTHONPATH": str(tmp_path), "FX_LOG": str(tmp_path / "fx.log")}


def _dirq_flow(tmp_path: Path) -> Path:
    q = tmp_path / "q"
    assert run_cli("dirq", "init", str(q)).returncode == 0
    for i in range(N):
        (q / "inbox" / f"m{i:04d}.json").write_text(json.dumps({"id": f"m{i:04d}"}))
    f = tmp_path / "flows.toml"
    f.write_text(
        'ledger = "./ledger.db"\n[flows.inv]\nsource = "dirq"\npath = "./q"\n'
        'id_field = "id"\n[flows.inv.python]\nfunction = "slowfx:post"\n'
    )
    return f


def _dirq_places(q: Path) -> Counter[str]:
    """Every message file by name, wherever it is (a claim of a stopped run included)."""
    names: Counter[str] = Counter()
    for folder in ("inbox", "done", "error", "retry", "processing"):
        names.update(p.name for p in (q / folder).rglob("*.json"))
    return names


@pytest.mark.parametrize("until_empty", [False, True], ids=["until-stopped", "until-empty"])
def test_onceq_run_of_a_directory_queue_stopped_while_it_starts(
    tmp_path: Path, effect_env: dict[str, str], until_empty: bool
) -> None:
    f = _dirq_flow(tmp_path)
    q = tmp_path / "q"
    onceq = str(Path(sys.executable).with_name("onceq"))  # the console script users run
    cmd = [onceq, "run", str(f), *(["--until-empty"] if until_empty else [])]
    for i, delay in enumerate(DELAYS):
        sig = signal.SIGINT if i == 3 else signal.SIGTERM
        code, err = _stopped_at(cmd, delay, sig, cwd=tmp_path, env=effect_env)
        assert code == _expected(until_empty, sig), (delay, code, err)
        _quiet(err)
        places = _dirq_places(q)
        assert sorted(places) == [f"m{i:04d}.json" for i in range(N)], delay  # none lost
        assert set(places.values()) == {1}, delay  # none in two places
        _no_call_twice(tmp_path / "fx.log")
    done = run_cli("run", str(f), "--until-empty", cwd=tmp_path, env=effect_env)
    assert done.returncode == 0, done.stderr
    assert sorted(_no_call_twice(tmp_path / "fx.log")) == [f"m{i:04d}" for i in range(N)]


def _claims(tmp_path: Path, url: str) -> None:
    topology(url)
    docs = [{"guid": f"g{i:04d}", "claimId": f"C{i}", "amount": 1, "docs": []} for i in range(N)]
    for d in docs:
        d["id"] = d["guid"]
    publish(url, *write_claims(tmp_path / "claims", docs))


@pytest.mark.parametrize("until_empty", [False, True], ids=["until-stopped", "until-empty"])
def test_onceq_run_of_a_rabbitmq_flow_stopped_while_it_starts(
    amqp_url: str, tmp_path: Path, effect_env: dict[str, str], until_empty: bool
) -> None:
    _claims(tmp_path, amqp_url)
    f = tmp_path / "flows.toml"
    f.write_text(
        'ledger = "./ledger.db"\n[flows.claims]\nsource = "rabbitmq"\nqueue = "claim.in"\n'
        'exchange = "eai.claim"\nrouting_key = "claim"\ndead_letter_exchange = "eai.dlx"\n'
        'id_field = "guid"\nretry = "exercise"\n[flows.claims.python]\nfunction = "slowfx:post"\n'
    )
    env = {**effect_env, "EAI_AMQP_URL": amqp_url}
    cmd = [
        sys.executable,
        "-m",
        "onceq",
        "run",
        str(f),
        *(["--until-empty"] if until_empty else []),
    ]
    for i, delay in enumerate(DELAYS):
        sig = signal.SIGINT if i == 3 else signal.SIGTERM
        code, err = _stopped_at(cmd, delay, sig, cwd=tmp_path, env=env)
        assert code == _expected(until_empty, sig), (delay, code, err)
        _quiet(err)
        calls = _no_call_twice(tmp_path / "fx.log")
        ready, unacked = queues(amqp_url, exact=True)["claim.in"]
        assert unacked == 0 and ready + len(calls) == N, (delay, ready, len(calls))
    done = run_cli("run", str(f), "--until-empty", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert sorted(_no_call_twice(tmp_path / "fx.log")) == [f"g{i:04d}" for i in range(N)]


@pytest.mark.parametrize("until_empty", [False, True], ids=["until-stopped", "until-empty"])
def test_mq_consume_stopped_while_it_starts(
    amqp_url: str, tmp_path: Path, until_empty: bool
) -> None:
    _claims(tmp_path, amqp_url)
    db = tmp_path / "ledger.db"
    with partner(delay=0.2) as stub:
        cmd = [sys.executable, "-m", "onceq", "mq", "consume", "--claim", stub.url,
               "--db", str(db), "--retry", "exercise", "--no-breaker",
               *(["--until-empty"] if until_empty else [])]  # fmt: skip
        env = {**os.environ, "EAI_AMQP_URL": amqp_url}
        for i, delay in enumerate(DELAYS):
            sig = signal.SIGINT if i == 3 else signal.SIGTERM
            code, err = _stopped_at(cmd, delay, sig, env=env)
            assert code == _expected(until_empty, sig), (delay, code, err)
            _quiet(err)
            calls = stub.stats()["by_guid"]
            assert [g for g, n in calls.items() if n > 1] == [], "a claim was called twice"
            ready, unacked = queues(amqp_url, exact=True)["claim.in"]
            assert unacked == 0 and ready + len(calls) == N, (delay, ready, len(calls))


@pytest.mark.parametrize("workers", [1, 2])
def test_dirq_consume_stopped_while_it_starts(tmp_path: Path, workers: int) -> None:
    """A batch: 130/143 when the signal stops it before the inbox is empty (--workers:
    the parent takes a signal that came before it started any worker)."""
    q = tmp_path / "q"
    assert run_cli("dirq", "init", str(q)).returncode == 0
    # Enough that the inbox outlasts most of the runs below at today's speed (one run
    # of 0.3 s took 2,200 files); the last runs may find it empty.
    n = 12000
    for i in range(n):
        doc = {"msg_id": f"m{i:05d}", "order_id": f"O{i}", "amount_cents": 1, "currency": "EUR"}
        (q / "inbox" / f"m{i:05d}.json").write_text(json.dumps(doc))
    cmd = [sys.executable, "-m", "onceq", "dirq", "consume", str(q), "--workers", str(workers)]
    for i, delay in enumerate(DELAYS[:8]):
        sig = signal.SIGINT if i == 3 else signal.SIGTERM
        code, err = _stopped_at(cmd, delay, sig)
        places = _dirq_places(q)
        assert len(places) == n and set(places.values()) == {1}, delay  # none lost or doubled
        unfinished = any((q / "inbox").iterdir())
        if unfinished:
            assert code == 128 + sig, (delay, code, err)
        else:
            # The signal came as the batch ended, its work done and durable: 0 when the
            # run had seen the inbox empty, 143/130 when the signal was first, and the
            # default action once Python's own shutdown has restored it (measured: the
            # same on asyncio's loop and uvloop's).
            assert code in (0, 128 + sig, -sig), (delay, code, err)
        _quiet(err)
    done = run_cli("dirq", "consume", str(q), "--json")
    assert done.returncode == 0, done.stderr
    assert len(list((q / "done").iterdir())) + len(list((q / "error").iterdir())) == n
