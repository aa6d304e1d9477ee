"""`onceq trace ID`: one message's journey, from the ledger, on both kinds of ledger.

The journeys are written by the ledgers' own commit and dead-letter operations (the
code the consumers and `mq dead replay|purge` use), then read back by the command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from onceq._cli import main
from onceq._core.transport import Delivery, Kind, Settle
from onceq._ledger.sqlite import Entry
from onceq._ledger.target import open_ledger
from onceq._ops.journey import trace


def entry(
    msg_id: str | None,
    kind: Kind,
    settle: Settle,
    reason: str = "",
    ref: str | None = None,
    detail: str = "",
    attempt: int = 1,
) -> Entry:
    d = Delivery(b"{}", ref or f"{msg_id}.json", msg_id, stable_ref=True)
    return Entry(d, kind, settle, reason, detail=detail, attempt=attempt)


def write_journeys(target: str) -> None:
    """INV-1: 503, 503 (delayed), dead on 422; replayed by op 1; done. INV-2: dead, purged
    by op 2. INV-3: done, then a copy refused. INV-1 also in flow `other`, done at once.
    bad.json: never parsed, dead."""
    inv = open_ledger(target, flow="invoices")
    other = open_ledger(target, flow="other")
    try:
        inv.commit([entry("INV-1", Kind.TRANSIENT, Settle.REQUEUE, "http-503", detail="BUSY")])
        inv.commit([entry("INV-1", Kind.TRANSIENT, Settle.DELAY, "http-503", attempt=2)])
        inv.commit(
            [entry("INV-1", Kind.REJECTED, Settle.DEAD, "http-422", detail="bad total", attempt=3)]
        )
        inv.commit([entry("INV-2", Kind.REJECTED, Settle.DEAD, "missing-field")])
        inv.commit([entry(None, Kind.REJECTED, Settle.DEAD, "parse", ref="bad.json")])
        op = inv.start_op("amqp", "replay", {"reason": "http-422"}, "invoice.dead")
        inv.record_replays(op, [("INV-1.json", "INV-1")])
        inv.finish_op(op)
        inv.commit([entry("INV-1", Kind.SUCCESS, Settle.ACK)])
        purge = inv.start_op("amqp", "purge", {"reason": "missing-field"}, "invoice.dead")
        inv.record_purged(purge, ["INV-2"])
        inv.finish_op(purge)
        inv.commit([entry("INV-3", Kind.SUCCESS, Settle.ACK)])
        inv.commit([entry("INV-3", Kind.DUPLICATE, Settle.ACK, ref="INV-3-again.json")])
        other.commit([entry("INV-1", Kind.SUCCESS, Settle.ACK)])
    finally:
        inv.close()
        other.close()


class Ran:
    def __init__(self, capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
        try:
            main(args)
            self.exit_code = 0
        except SystemExit as exc:
            self.exit_code = int(exc.code or 0)
        got = capsys.readouterr()
        self.output, self.err = got.out, got.err
        self.all = got.out + got.err


def steps(j: Any) -> list[tuple[str, Any, Any]]:
    return [(s.step, s.attempt, s.reason) for s in j.steps]


def test_a_journey_in_time_order_with_attempts_replay_and_final_state(ledger_target: str) -> None:
    write_journeys(ledger_target)
    found = trace(ledger_target, "INV-1")
    assert [(j.flow, j.state) for j in found] == [("invoices", "done"), ("other", "done")]
    inv = found[0]
    assert steps(inv) == [
        ("retry", 1, "http-503"),
        ("delayed", 2, "http-503"),
        ("dead", 3, "http-422"),
        ("replayed", None, None),
        ("done", None, None),
    ]
    assert inv.steps[0].detail == "BUSY" and inv.steps[2].detail == "bad total"
    replay = inv.steps[3].op
    assert replay is not None and replay["op"] == "replay" and replay["count"] == 1
    assert replay["filter"] == {"reason": "http-422"} and replay["queue"] == "invoice.dead"
    assert [s.at for s in inv.steps] == sorted(s.at for s in inv.steps)


def test_purged_duplicate_and_never_parsed(ledger_target: str) -> None:
    write_journeys(ledger_target)
    (purged,) = trace(ledger_target, "INV-2")
    assert purged.state == "purged"
    assert [s.step for s in purged.steps] == ["dead", "purged"]
    op = purged.steps[1].op
    assert op is not None and op["op"] == "purge" and "_ids" not in op
    (dup,) = trace(ledger_target, "INV-3")
    assert dup.state == "done"
    assert [(s.step, s.ref) for s in dup.steps] == [
        ("done", "INV-3.json"),
        ("duplicate", "INV-3-again.json"),
    ]
    (bad,) = trace(ledger_target, "bad.json")
    assert (bad.msg_id, bad.state, steps(bad)) == (None, "dead", [("dead", 1, "parse")])


def test_flow_filter_and_unknown_id(ledger_target: str) -> None:
    write_journeys(ledger_target)
    assert [j.flow for j in trace(ledger_target, "INV-1", ["other"])] == ["other"]
    assert trace(ledger_target, "INV-1", ["nope"]) == []
    assert trace(ledger_target, "INV-404") == []


def test_the_command_shows_json_and_exit_codes(
    ledger_target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_journeys(ledger_target)
    run = Ran(capsys, ["trace", "INV-1", "--db", ledger_target, "--json"])
    assert run.exit_code == 0, run.output
    doc = json.loads(run.output)
    assert doc["id"] == "INV-1" and [j["flow"] for j in doc["journeys"]] == ["invoices", "other"]
    assert [s["step"] for s in doc["journeys"][0]["steps"]][-2:] == ["replayed", "done"]

    text = Ran(capsys, ["trace", "INV-1", "--db", ledger_target])
    assert text.exit_code == 0
    for word in ("invoices · INV-1 · done", "retried", "delayed", "dead", "replayed", "bad total"):
        assert word in text.output, (word, text.output)

    missing = Ran(capsys, ["trace", "INV-404", "--db", ledger_target])
    assert missing.exit_code == 3
    assert "INV-404: no flow of" in missing.err and "Traceback" not in missing.all


def test_hostile_ids_are_shown_as_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An id is the sender's text: rich markup in it is printed, not interpreted."""
    db = str(tmp_path / "l.db")
    book = open_ledger(db, flow="f")
    try:
        book.commit([entry("[bold red]x[/]", Kind.SUCCESS, Settle.ACK, ref="a.json")])
    finally:
        book.close()
    run = Ran(capsys, ["trace", "[bold red]x[/]", "--db", db])
    assert run.exit_code == 0 and "[bold red]x[/]" in run.output


def test_no_ledger_is_not_found_and_nothing_is_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "none.db"
    run = Ran(capsys, ["trace", "x", "--db", str(db)])
    assert run.exit_code == 3 and "no onceq ledger there" in run.err
    assert not db.exists()


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["trace"], 2, "Missing argument 'ID'"),
        (["trace", "x", "nope.toml"], 3, "nope.toml: no such flow file"),
    ],
)
def test_usage_mistakes(
    args: list[str],
    code: int,
    says: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    run = Ran(capsys, args)
    assert run.exit_code == code and says in run.err, run.all


def test_without_a_flow_file_or_db_it_says_what_to_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    run = Ran(capsys, ["trace", "x"])
    assert run.exit_code == 3 and "no flows.toml here" in run.err


def test_a_flow_files_ledger_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "q").mkdir()
    (tmp_path / "flows.toml").write_text(
        'ledger = "./ledger.db"\n[flows.invoices]\nsource = "dirq"\npath = "./q"\n'
        'id_field = "invoiceId"\n'
    )
    write_journeys(str(tmp_path / "ledger.db"))
    run = Ran(capsys, ["trace", "INV-2", "--json"])
    assert run.exit_code == 0, run.all
    assert json.loads(run.output)["journeys"][0]["state"] == "purged"
