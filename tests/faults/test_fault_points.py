"""A real consumer killed at each fault-injection point (onceq._core.faults), then a second run.

A kill from outside lands in the commit → settle window only by chance; here the
consumer SIGKILLs itself at the named point (ONCEQ_FAULT, ONCEQ_FAULT_AFTER), so each
window is hit on every run. The second run must then finish the work: what the
first committed is counted as `recovered` (not a duplicate, not processed again),
every message is in exactly one final place, processing/ is empty / the queue is
empty with nothing unacked, and the claim system got each guid exactly once.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from test_dirq_crash import check_invariants, finish, make_queue, rows

from broker_support import Broker, broker_fixture, empty  # noqa: F401
from mq_support import claim_doc, partner, publish, topology, write_claims
from nats_support import nats_names_fixture  # noqa: F401
from support import run_cli

# (point, N): fire the Nth time the point is reached. N > 1 where the first group
# should settle first, so the kill lands mid-run and not on the very first message.
DIRQ_POINTS = [
    ("before-commit", 2),
    ("after-commit-before-settle", 1),
    ("after-commit-before-settle", 3),
    ("mid-settle", 1),
    ("mid-settle", 40),
    ("after-claim", 5),
]


def claimed_files(root: Path) -> set[str]:
    """Message files left in worker folders under processing/."""
    out: set[str] = set()
    for d in (root / "processing").iterdir():
        out |= {n for n in os.listdir(d) if not n.startswith(".")}
    return out


def committed_refs(db: Path) -> set[str]:
    """Every file the ledger holds an outcome for (effect, duplicate or failure)."""
    refs: set[str] = set()
    for table in ("processed", "duplicates", "failures"):
        refs |= {r for (r,) in rows(db, f"SELECT ref FROM {table}")}
    return refs


def killed_run(root: Path, point: str, after: int) -> None:
    env = {"ONCEQ_FAULT": point, "ONCEQ_FAULT_AFTER": str(after)}
    r = run_cli("dirq", "consume", str(root), "--json", env=env, timeout=120)
    assert r.returncode == -9, (r.returncode, r.stdout, r.stderr)  # it killed itself
    assert r.stdout == ""  # no summary: nothing of ours ran after the kill


@pytest.mark.parametrize(("point", "after"), DIRQ_POINTS)
def test_dirq_killed_at_a_fault_point_recovers_exactly(
    tmp_path: Path, point: str, after: int
) -> None:
    root = tmp_path / "q"
    exp = make_queue(root, 700, seed=11, adjacent=0.05)
    killed_run(root, point, after)

    stranded = claimed_files(root)
    assert stranded, "the kill must leave claims behind, or the point was never reached"
    db = root / "ledger.db"
    # Committed and not yet moved: exactly what the next run must count as recovered.
    in_window = committed_refs(db) & stranded
    if point in ("before-commit", "after-claim"):
        # The kill fell before this group's commit: its claims are in no ledger row. The
        # group before it may be committed with its moves still running in the mover's
        # thread (they overlap this commit): those are in the window, and recovered.
        assert stranded - in_window, "this group's claims must be uncommitted"
    else:
        assert in_window, "the kill must fall after a commit, before its moves"
    if point == "mid-settle":
        # One file of the group is already linked into done/ or error/ and still claimed.
        finished = set(os.listdir(root / "done")) | set(os.listdir(root / "error"))
        assert finished & stranded

    summary = finish(root)
    assert summary["recovered"] == len(in_window)
    check_invariants(root, exp)  # duplicates are exactly the re-sent ids, nothing twice


def test_an_unknown_fault_point_is_refused_before_anything_runs(tmp_path: Path) -> None:
    root = tmp_path / "q"
    make_queue(root, 5, seed=1)
    before = sorted(os.listdir(root / "inbox"))
    r = run_cli("dirq", "consume", str(root), env={"ONCEQ_FAULT": "after-comit"})
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.startswith("onceq: ONCEQ_FAULT: unknown fault point 'after-comit'")
    assert "Traceback" not in r.stderr
    assert sorted(os.listdir(root / "inbox")) == before and not (root / "ledger.db").exists()
    # The list it gives names the engine's points and every source's own.
    for point in ("before-commit", "after-claim", "after-delay-publish", "after-dead-publish"):
        assert point in r.stderr
    r = run_cli("dirq", "consume", str(root), env={"ONCEQ_FAULT": "mid-settle",
                                                   "ONCEQ_FAULT_AFTER": "0"})  # fmt: skip
    assert r.returncode == 2 and "ONCEQ_FAULT_AFTER: '0'" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ("dirq", "replay", "{q}", "--all"),  # reaches mid-replay, outside a consume run
        ("dirq", "dead", "{q}"),
        ("nats", "dead", "list", "--stream", "ONCEQ_NOT_THERE"),
        ("mq", "dead", "list", "--db", "{q}/ledger.db"),
        ("ledger", "stats", "--db", "{q}/ledger.db"),
    ],
    ids=lambda a: " ".join(a[:3]),
)
def test_every_command_refuses_an_unknown_fault_point(
    tmp_path: Path, argv: tuple[str, ...]
) -> None:
    """Not only a consume run: a command that changes something (a replay) would run to
    its end with a mistyped point and let a crash test pass that never crashed."""
    root = tmp_path / "q"
    make_queue(root, 2, seed=3)
    for name in os.listdir(root / "inbox"):  # two files to replay
        os.rename(root / "inbox" / name, root / "error" / name)
    before = {d: sorted(os.listdir(root / d)) for d in ("inbox", "error")}
    r = run_cli(*(a.format(q=root) for a in argv), env={"ONCEQ_FAULT": "mid-replai"})
    assert (r.returncode, r.stdout) == (2, ""), (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("onceq: ONCEQ_FAULT: unknown fault point 'mid-replai'")
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert {d: sorted(os.listdir(root / d)) for d in ("inbox", "error")} == before
    assert not (root / "ledger.db").exists()


def test_the_engine_holds_three_points_and_each_source_declares_its_own() -> None:
    """A source's windows are its package's (SourceType.fault_points), so a new transport
    changes nothing in onceq._core.faults; one name is one owner's."""
    from onceq._core import faults
    from onceq._sources.registry import named, types

    types()  # load the built-in types: their points are declared as they load
    assert list(faults.ENGINE_POINTS) == ["before-commit", "after-commit-before-settle",
                                          "mid-settle"]  # fmt: skip
    owners = faults.points()
    assert {p: o for p, o in owners.items() if o != "engine"} == {
        "after-claim": "dirq",
        "after-retry-link": "dirq",
        "mid-replay": "dirq",
        "after-delay-publish": "rabbitmq",
        "after-dead-publish": "nats",
    }
    for kind in ("dirq", "rabbitmq", "nats"):
        t = named(kind)
        assert t is not None and set(t.fault_points) == {p for p, o in owners.items() if o == kind}
        assert all(text.strip() for text in t.fault_points.values())
    with pytest.raises(ValueError, match="'mid-replay' of nats is already dirq's"):
        faults.declare("nats", {"mid-replay": "taken"})
    faults.declare("dirq", {"mid-replay": "again, by its owner"})  # idempotent
    assert faults.points()["mid-replay"] == "dirq"


def test_unset_fault_points_cost_one_empty_call() -> None:
    """With ONCEQ_FAULT unset the hot loops call a function that does nothing."""
    code = (
        "import onceq._core.faults as f, json; "
        "print(json.dumps([f.hit.__name__, f._POINT, f.hit('after-claim')]))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEQ_FAULT")}
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == ["_off", None, None]


# --- the broker sources (RabbitMQ, NATS JetStream): one body each, run over both ---

# prefetch 1: one delivery in flight, so a group is one message and no other claim
# call is under way when the process kills itself: "each guid exactly once" is then
# a promise the run can keep (a call whose record dies with the process is the
# at-least-once part, and only before-commit has one).
BROKER_POINTS = [
    ("before-commit", 2),
    ("after-commit-before-settle", 1),
    ("after-commit-before-settle", 3),
    ("mid-settle", 2),
]


@pytest.mark.parametrize(("point", "after"), BROKER_POINTS)
def test_broker_killed_at_a_fault_point_recovers_exactly(
    broker: Broker, tmp_path: Path, point: str, after: int
) -> None:
    n = 12
    docs = [claim_doc(f"f-{i:03d}") for i in range(n)]
    resent = ["f-007", "f-009"]  # published again, last: real duplicates
    broker.prepare(docs, [claim_doc(g) for g in resent])
    db = tmp_path / "p.db"
    with partner() as p:
        first = broker.consume(db, p.url, "--prefetch", "1", ONCEQ_FAULT=point,
                               ONCEQ_FAULT_AFTER=str(after))  # fmt: skip
        assert first.returncode == -9, (first.returncode, first.stderr)
        assert first.stdout == ""
        called_first = p.stats()["by_guid"]
        committed = {m for (m,) in rows(db, "SELECT msg_id FROM messages")}
        broker.returned()
        second = broker.consume(db, p.url, "--prefetch", "1")
        calls = p.stats()["by_guid"]
    assert second.returncode == 0, second.stderr
    summary = json.loads(second.stdout)
    assert summary["drained"] is True

    # Called before the kill and never recorded: only before-commit leaves one.
    again = set(called_first) - committed
    assert len(again) == (1 if point == "before-commit" else 0), (again, called_first)
    assert calls == {f"f-{i:03d}": 2 if f"f-{i:03d}" in again else 1 for i in range(n)}
    if point == "after-commit-before-settle":
        assert summary["recovered"] == 1  # the committed, never-acked copy
    elif point == "mid-settle":
        assert summary["recovered"] in (0, 1)  # its ack may have left before the kill
    else:
        assert summary["recovered"] == 0
    assert rows(db, "SELECT count(*) FROM messages") == [(n,)]
    assert [m for (m,) in rows(db, "SELECT DISTINCT msg_id FROM duplicates ORDER BY 1")] == resent
    assert summary["duplicates"] == len(resent)
    assert broker.state() == empty(broker)


@pytest.mark.parametrize("after", [1, 3])
def test_broker_killed_with_copies_stored_and_originals_unacked_loses_nothing(
    broker: Broker, tmp_path: Path, after: int
) -> None:
    """The source's own window (RabbitMQ: a DELAY settle's tier copy confirmed; NATS: a
    dead letter stored) before the original's ack: the message exists twice, never
    zero times, and a second run leaves each failing claim dead (once; at worst twice
    where both the original and its copy can reach their last attempt)."""
    good = [f"ok-{i:02d}" for i in range(8)]
    failing = [f"bad-{i:02d}" for i in range(4)]
    docs = [claim_doc(g) for g in good] + [broker.copy_doc(g) for g in failing]
    docs.sort(key=lambda d: d["guid"][-2:])  # interleaved: groups mix both kinds
    broker.prepare_copies(docs)
    db = tmp_path / "p.db"
    with partner() as p:
        first = broker.consume_copies(db, p.url, ONCEQ_FAULT=broker.copy_point,
                                      ONCEQ_FAULT_AFTER=str(after))  # fmt: skip
        assert first.returncode == -9, (first.returncode, first.stderr)
        broker.returned()
        after_kill = broker.inventory(db)
        # Nothing lost: every message is somewhere; the one in the window is there
        # twice (the unacked original and its stored copy), every other once.
        assert set(after_kill) == set(good) | set(failing), after_kill
        doubled = {g for g, n in after_kill.items() if n > 1}
        assert len(doubled) == 1 and doubled <= set(failing), after_kill
        assert max(after_kill.values()) == 2

        second = broker.consume_copies(db, p.url)
        calls = p.stats()["by_guid"]
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["drained"] is True
    # Each good claim was called once and recorded once, across the kill.
    assert {g: calls[g] for g in good} == dict.fromkeys(good, 1)
    assert sorted(g for (g,) in rows(db, "SELECT msg_id FROM messages")) == good
    dead = Counter(broker.dead_ids())
    twice = 2 if broker.dead_twice else 1
    assert dead == {g: twice if g in doubled else 1 for g in failing}, dead
    assert broker.copies_left() == 0
    state = broker.state()
    assert {k: v for k, v in state.items() if k != "dead"} == {
        k: v for k, v in empty(broker).items() if k != "dead"
    }


def test_each_published_copy_carries_its_own_copy_id(amqp_url: str, tmp_path: Path) -> None:
    """The id that tells a recovered copy from a re-sent one: one per publish, even for
    two files with the same guid."""
    from mq_support import get_all
    from onceq._sources.amqp.transport import COPY_HEADER

    topology(amqp_url)
    publish(amqp_url, *write_claims(tmp_path / "c", [claim_doc("same"), claim_doc("same")]))
    ids = [props.headers[COPY_HEADER] for _, props, _ in get_all(amqp_url, "claim.in")]
    assert len(ids) == 2 and len(set(ids)) == 2
    assert all(len(i) == 32 for i in ids)


def test_an_armed_point_of_the_running_source_imports_no_other_source() -> None:
    """Checking ONCEQ_FAULT costs a run no other source's package when the point is the
    engine's or its own source's; only a point no loaded type declares loads them all."""
    import subprocess
    import sys

    code = (
        "import sys, json; from onceq._sources import registry; registry.named('dirq'); "
        "print(json.dumps(sorted(m for m in ('onceq._sources.nats.plugin', "
        "'onceq._sources.amqp.plugin') if m in sys.modules)))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEQ_FAULT")}
    for point, loaded in [
        ("mid-settle", []),
        ("after-claim", []),
        ("after-dead-publish", ["onceq._sources.amqp.plugin", "onceq._sources.nats.plugin"]),
    ]:
        out = subprocess.run([sys.executable, "-c", code], env={**env, "ONCEQ_FAULT": point},
                             capture_output=True, text=True, check=True)  # fmt: skip
        assert json.loads(out.stdout) == loaded, (point, out.stderr)
    bad = subprocess.run([sys.executable, "-c", code], env={**env, "ONCEQ_FAULT": "after-clam"},
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 1 and "unknown fault point 'after-clam'" in bad.stderr
