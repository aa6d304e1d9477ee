"""The directory-queue commands as a user runs them: schema, order-check, lag, replay, report."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from cli_support import invoke
from support import SAMPLE, open_db, snapshot

COMMANDS = ("init", "consume", "schema", "order-check", "lag", "replay", "report")


# --- helpers ------------------------------------------------------------------------


def _msg(msg_id: str, order_no: str, seq: object, amount: object = 1, **extra: object) -> bytes:
    return json.dumps(
        {"msg_id": msg_id, "order_no": order_no, "seq": seq, "amount": amount, **extra}
    ).encode()


def _queue(tmp_path: Path, files: dict[str, bytes], name: str = "q") -> Path:
    """A queue whose inbox holds files, made the user's way (init --from)."""
    src = tmp_path / f"{name}-fixtures"
    src.mkdir()
    for n, body in files.items():
        (src / n).write_bytes(body)
    q = tmp_path / name
    r = invoke("dirq", "init", str(q), "--from", str(src))
    assert r.returncode == 0, r.stderr
    return q


def _consume(q: Path, *args: str) -> None:
    r = invoke("dirq", "consume", str(q), "--json", *args)
    assert r.returncode == 0, r.stderr


@pytest.fixture
def sample_q(tmp_path: Path) -> Path:
    q = tmp_path / "sample"
    assert invoke("dirq", "init", str(q), "--from", str(SAMPLE)).returncode == 0
    _consume(q)
    return q


def _one_line_error(r: object) -> None:
    lines = r.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith("onceq: "), r.stderr  # type: ignore[attr-defined]


# --- help ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_every_dirq_command_has_help_with_an_example(command: str) -> None:
    r = invoke("dirq", command, "--help")
    assert r.returncode == 0, r.stderr
    assert "Example" in r.stdout


# --- schema -------------------------------------------------------------------------


def _schema_rows(text: str) -> list[list[str]]:
    return list(csv.reader(text.splitlines()))


def test_schema_of_the_sample_is_the_fields_of_a_normal_message(tmp_path: Path) -> None:
    q = tmp_path / "q"
    invoke("dirq", "init", str(q), "--from", str(SAMPLE))
    before = invoke("dirq", "schema", str(q))
    assert before.returncode == 0, before.stderr
    assert _schema_rows(before.stdout) == [
        ["field", "type", "role"],
        ["msg_id", "string", "idempotency-key"],
        ["order_no", "string", ""],
        ["seq", "integer", "sequence"],
        ["amount", "number", ""],  # 1200 and 350.5: integer mixed with number
        ["currency", "string", ""],
        ["sent_at", "string", ""],
    ]
    # After a consume the valid messages sit in done/: the same schema.
    _consume(q)
    out = tmp_path / "schema.csv"
    r = invoke("dirq", "schema", str(q), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_text() == before.stdout


def test_schema_reads_only_valid_messages_and_names_every_type(tmp_path: Path) -> None:
    q = _queue(
        tmp_path,
        {
            "a.json": _msg("m1", "A", 1, 5, tags=["x"], gift=True),
            "b.json": _msg("m2", "A", 2, 5.5, meta={"k": 1}, note=None),
            "c.json": _msg("m3", "B", 1, 7, ref="r-1"),
            "d.json": _msg("m4", "B", 2, 7, ref=12),
            # Invalid files: their fields are not the fields of a normal message.
            "bad-type.json": _msg("m5", "A", "3", 1, only_in_bad=1),
            "no-amount.json": json.dumps({"msg_id": "m6", "order_no": "A", "seq": 4}).encode()[:-1]
            + b', "only_in_missing": 1}',
            "broken.json": b'{"only_in_broken": 1',
        },
    )
    r = invoke("dirq", "schema", str(q))
    assert r.returncode == 0, r.stderr
    assert _schema_rows(r.stdout) == [
        ["field", "type", "role"],
        ["msg_id", "string", "idempotency-key"],
        ["order_no", "string", ""],
        ["seq", "integer", "sequence"],
        ["amount", "number", ""],
        ["tags", "array", ""],
        ["gift", "boolean", ""],
        ["meta", "object", ""],
        ["note", "null", ""],
        ["ref", "integer|string", ""],
    ]


def test_schema_of_a_missing_queue_is_not_found(tmp_path: Path) -> None:
    before = snapshot(tmp_path)
    r = invoke("dirq", "schema", str(tmp_path / "nope"))
    assert r.returncode == 3
    _one_line_error(r)
    assert snapshot(tmp_path) == before  # no queue folder, no schema.csv made


# --- order-check --------------------------------------------------------------------


def test_order_check_is_ok_on_the_sample(sample_q: Path, tmp_path: Path) -> None:
    out = tmp_path / "order-result.txt"
    r = invoke("dirq", "order-check", "--db", str(sample_q / "ledger.db"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_text().splitlines()[0] == "OK"
    # QDIR names QDIR/ledger.db; without -o the result is printed.
    r = invoke("dirq", "order-check", str(sample_q))
    assert (r.returncode, r.stdout) == (0, "OK\n")


def test_order_check_reports_a_repeated_seq(tmp_path: Path) -> None:
    q = _queue(
        tmp_path,
        {
            "1.json": _msg("m1", "A", 1),
            "2.json": _msg("m2", "A", 2),
            "3.json": _msg("m3", "A", 2),  # another message claims A's place 2
            "4.json": _msg("m2", "A", 2),  # a duplicate message is not a repeated seq
            "5.json": _msg("m4", "B", 1),
        },
    )
    _consume(q)
    out = tmp_path / "result.txt"
    r = invoke("dirq", "order-check", "--db", str(q / "ledger.db"), "-o", str(out))
    assert r.returncode == 1, r.stderr
    assert list(csv.reader(out.read_text().splitlines())) == [
        ["order_no", "problem", "seq_from", "seq_to", "n", "msg_ids"],
        ["A", "repeated", "2", "2", "2", "m2 m3"],
    ]


def test_order_check_reports_gaps_including_a_late_start(tmp_path: Path) -> None:
    q = _queue(
        tmp_path,
        {
            "1.json": _msg("m1", "A", 1),
            "2.json": _msg("m2", "A", 4),
            "3.json": _msg("m3", "B", 2),  # B never got its seq 1
            "4.json": _msg("m4", "C", 1),
        },
    )
    _consume(q)
    r = invoke("dirq", "order-check", "--db", str(q / "ledger.db"), "--json")
    assert r.returncode == 1, r.stderr
    result = json.loads(r.stdout)
    assert result["ok"] is False
    gaps = [(x["order_no"], x["problem"], x["seq_from"], x["seq_to"]) for x in result["rows"]]
    assert gaps == [("A", "gap", 2, 3), ("B", "gap", 1, 1)]


def test_order_check_runs_a_users_query_read_only(sample_q: Path, tmp_path: Path) -> None:
    docs = [d for d in map(_loads, SAMPLE.glob("*.json")) if d is not None]
    # Distinct ids: a duplicate copy never becomes a second row.
    big = sorted({d["msg_id"] for d in docs if d.get("amount", 0) > 1000})
    sql = tmp_path / "big.sql"
    sql.write_text(
        "-- large orders\nSELECT msg_id FROM processed WHERE amount > 1000 ORDER BY 1;\n"
    )
    out = tmp_path / "big.txt"
    r = invoke("dirq", "order-check", str(sample_q), "--sql", str(sql), "-o", str(out))
    assert r.returncode == 1, r.stderr
    assert out.read_text().splitlines() == ["msg_id", *big]

    nothing = tmp_path / "none.sql"
    nothing.write_text("SELECT msg_id FROM processed WHERE amount < 0")
    r = invoke("dirq", "order-check", str(sample_q), "--sql", str(nothing), "-o", str(out))
    assert r.returncode == 0
    assert out.read_text() == "OK\n"

    # A query that writes is refused by the ledger, and the ledger keeps its rows.
    delete = tmp_path / "delete.sql"
    delete.write_text("DELETE FROM processed")
    r = invoke("dirq", "order-check", str(sample_q), "--sql", str(delete))
    assert r.returncode == 8
    _one_line_error(r)
    with open_db(sample_q / "ledger.db") as conn:
        assert conn.execute("SELECT count(*) FROM processed").fetchone()[0] == 15


def _loads(p: Path) -> dict | None:
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError:
        return None


def test_order_check_argument_errors(sample_q: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty.sql"
    empty.write_text("-- nothing\n")
    before = snapshot(tmp_path)
    r = invoke("dirq", "order-check")
    assert r.returncode == 2
    _one_line_error(r)
    missing = tmp_path / "no" / "ledger.db"
    r = invoke("dirq", "order-check", "--db", str(missing))
    assert r.returncode == 3
    _one_line_error(r)
    assert not missing.exists() and not missing.parent.exists()  # a check creates nothing
    r = invoke("dirq", "order-check", str(sample_q), "--sql", str(empty))
    assert r.returncode == 2
    _one_line_error(r)
    r = invoke("dirq", "order-check", str(sample_q), "--sql", str(tmp_path / "nope.sql"))
    assert r.returncode == 3
    _one_line_error(r)
    # No result file, no ledger change, nothing new anywhere.
    assert snapshot(tmp_path) == before


# --- lag ----------------------------------------------------------------------------


def _lag_queue(tmp_path: Path) -> Path:
    q = _queue(tmp_path, {f"m{i}.json": _msg(f"m{i}", "A", i) for i in range(1, 4)})
    inbox = q / "inbox"
    (inbox / ".m9.json.1234.tmp").write_bytes(b"{")  # a producer's write in progress
    (inbox / "late.json.tmp").write_bytes(b"{")
    (inbox / ".hidden").write_bytes(b"x")
    worker = q / "processing" / "w-123-abc"
    worker.mkdir()
    (worker / ".lock").write_bytes(b"")
    (worker / "c1.json").write_bytes(b"{}")
    (worker / "c2.json").write_bytes(b"{}")
    (q / "processing" / "loose.json").write_bytes(b"{}")
    (q / "processing" / ".w-9-new").mkdir()  # a worker folder being made
    (q / "error" / "e1.json").write_bytes(b"")
    (q / "error" / ".e2.json.tmp").write_bytes(b"")
    return q


def test_lag_counts_messages_and_compares_the_inbox(tmp_path: Path) -> None:
    q = _lag_queue(tmp_path)
    line = "inbox=3 processing=3 error=1\n"
    r = invoke("dirq", "lag", str(q), "3")  # equal to the threshold: fine
    assert (r.returncode, r.stdout, r.stderr) == (0, line, "")
    r = invoke("dirq", "lag", str(q), "2")  # above it
    assert (r.returncode, r.stdout) == (1, line)
    r = invoke("dirq", "lag", str(q), "0", "--json")
    assert r.returncode == 1
    assert json.loads(r.stdout) == {
        "inbox": 3,
        "processing": 3,
        "error": 1,
        "threshold": 0,
        "over": True,
    }


@pytest.mark.parametrize("threshold", ["-1", "abc", "1.5", "", " 3", "٣"])
def test_lag_refuses_a_bad_threshold_in_one_line(tmp_path: Path, threshold: str) -> None:
    q = _lag_queue(tmp_path)
    r = invoke("dirq", "lag", str(q), threshold)
    assert r.returncode == 2
    assert r.stdout == ""
    _one_line_error(r)


def test_lag_refuses_a_missing_or_partial_queue(tmp_path: Path) -> None:
    r = invoke("dirq", "lag", str(tmp_path / "nope"), "5")
    assert r.returncode == 2
    _one_line_error(r)
    (tmp_path / "half" / "inbox").mkdir(parents=True)
    before = snapshot(tmp_path)
    r = invoke("dirq", "lag", str(tmp_path / "half"), "5")
    assert r.returncode == 2
    _one_line_error(r)
    assert r.stdout == ""
    assert snapshot(tmp_path) == before  # the missing folders are not made up


def _imported_modules(*args: str) -> str:
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "onceq", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return r.stderr


def test_lag_does_not_import_rich(tmp_path: Path) -> None:
    q = _lag_queue(tmp_path)
    imported = _imported_modules("dirq", "lag", str(q), "9")
    # The probe itself works (at whatever depth: a command module may import it first).
    assert re.search(r"\| +onceq\._sources\.dirq\.queue$", imported, re.MULTILINE)
    assert "rich" not in imported


def test_lag_does_not_import_sqlite(tmp_path: Path) -> None:
    q = _lag_queue(tmp_path)
    assert "sqlite3" not in _imported_modules("dirq", "lag", str(q), "9")


# --- replay -------------------------------------------------------------------------


def test_replay_moves_the_file_back_and_records_it(sample_q: Path) -> None:
    body = (sample_q / "error" / "msg-009.json").read_bytes()
    r = invoke("dirq", "replay", str(sample_q), "msg-009.json")
    assert r.returncode == 0, r.stderr
    assert not (sample_q / "error" / "msg-009.json").exists()
    assert (sample_q / "inbox" / "msg-009.json").read_bytes() == body
    with open_db(sample_q / "ledger.db") as conn:
        assert conn.execute("SELECT ref FROM replays").fetchall() == [("msg-009.json",)]


def test_replay_records_into_the_db_named_by_option(tmp_path: Path) -> None:
    q = _queue(tmp_path, {"x.json": b"{"})
    db = tmp_path / "elsewhere" / "l.db"
    db.parent.mkdir()  # a ledger's folder is never created (a typo would start a new one)
    _consume(q, "--db", str(db))
    r = invoke("dirq", "replay", str(q), "x.json", "--db", str(db))
    assert r.returncode == 0, r.stderr
    assert not (q / "ledger.db").exists()
    with open_db(db) as conn:
        assert conn.execute("SELECT ref FROM replays").fetchall() == [("x.json",)]


REFUSALS = [
    ("missing.json", 3),
    ("..", 2),
    (".", 2),
    ("/etc/passwd", 2),
    ("", 2),
    ("a/b", 2),
    ("msg-015.json", 4),  # inbox/ holds a file of that name already
]


@pytest.mark.parametrize(("name", "code"), REFUSALS)
def test_a_refused_replay_changes_no_folder_and_no_database(
    sample_q: Path, name: str, code: int
) -> None:
    (sample_q / "inbox" / "msg-015.json").write_bytes(b'{"fixed": "by a human"}')
    before = snapshot(sample_q)
    assert "ledger.db" in before
    r = invoke("dirq", "replay", str(sample_q), name)
    assert r.returncode == code, r.stderr
    _one_line_error(r)
    assert snapshot(sample_q) == before


@pytest.mark.parametrize(("name", "code"), REFUSALS)
def test_a_refused_replay_does_not_create_the_database(
    tmp_path: Path, name: str, code: int
) -> None:
    q = tmp_path / "q"
    invoke("dirq", "init", str(q))
    (q / "error" / "msg-015.json").write_bytes(b"{")
    (q / "error" / "a").mkdir()
    (q / "inbox" / "msg-015.json").write_bytes(b"{}")
    other_db = tmp_path / "other" / "l.db"
    before = snapshot(tmp_path)
    r = invoke("dirq", "replay", str(q), name, "--db", str(other_db))
    assert r.returncode == code, r.stderr
    r = invoke("dirq", "replay", str(q), name)
    assert r.returncode == code, r.stderr
    assert snapshot(tmp_path) == before
    assert not (q / "ledger.db").exists() and not other_db.parent.exists()


def test_replay_on_a_missing_queue_is_not_found(tmp_path: Path) -> None:
    r = invoke("dirq", "replay", str(tmp_path / "nope"), "x.json")
    assert r.returncode == 3
    _one_line_error(r)
    assert not (tmp_path / "nope").exists()


# --- report (dup.txt, error.csv) ----------------------------------------------------


def test_reports_come_from_durable_state(sample_q: Path, tmp_path: Path) -> None:
    assert invoke("dirq", "report", str(sample_q)).returncode == 0
    dup, err = (sample_q / "dup.txt").read_bytes(), (sample_q / "error.csv").read_bytes()
    ids = [json.loads(p.read_text())["msg_id"] for p in sorted(SAMPLE.glob("*.json")) if _loads(p)]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    assert dup.decode().splitlines() == repeated
    assert err.decode() == "file,reason\nmsg-009.json,parse\nmsg-015.json,missing-field\n"
    # A second (empty) consume and a second report write the very same bytes.
    _consume(sample_q)
    assert invoke("dirq", "report", str(sample_q)).returncode == 0
    assert (sample_q / "dup.txt").read_bytes() == dup
    assert (sample_q / "error.csv").read_bytes() == err
    assert not [n for n in os.listdir(sample_q) if n.endswith(".tmp")]


def test_dup_txt_keeps_duplicates_of_earlier_runs(tmp_path: Path) -> None:
    q = _queue(tmp_path, {"1.json": _msg("m-b", "A", 1), "2.json": _msg("m-b", "A", 1)})
    _consume(q)
    assert invoke("dirq", "report", str(q)).returncode == 0
    assert (q / "dup.txt").read_text() == "m-b\n"
    # A later run sees a duplicate of another id (m-a sorts first) and nothing of m-b.
    (q / "inbox" / "3.json").write_bytes(_msg("m-a", "B", 1))
    (q / "inbox" / "4.json").write_bytes(_msg("m-a", "B", 1))
    _consume(q)
    assert invoke("dirq", "report", str(q)).returncode == 0
    assert (q / "dup.txt").read_text() == "m-a\nm-b\n"


def test_error_csv_reasons_unknown_and_clash_names(tmp_path: Path) -> None:
    q = _queue(tmp_path, {"x.json": b"{"})
    _consume(q)
    (q / "inbox" / "x.json").write_bytes(b"{ again")  # the same name fails again
    _consume(q)
    (q / "error" / "by-hand.json").write_bytes(b"?")  # no ledger record at all
    assert sorted(os.listdir(q / "error")) == ["by-hand.json", "x.json", "x.json.1"]
    r = invoke("dirq", "report", str(q), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["errors"] == 3
    assert (q / "error.csv").read_text() == (
        "file,reason\nby-hand.json,unknown\nx.json,parse\nx.json.1,parse\n"
    )


def test_report_needs_a_queue_and_a_ledger(tmp_path: Path) -> None:
    q = tmp_path / "q"
    invoke("dirq", "init", str(q))
    r = invoke("dirq", "report", str(q))
    assert r.returncode == 3  # never consumed: no ledger, and report does not create one
    _one_line_error(r)
    assert not (q / "ledger.db").exists()
    _consume(q)
    shutil.rmtree(q / "error")
    before = snapshot(q)
    r = invoke("dirq", "report", str(q))
    assert r.returncode == 3
    _one_line_error(r)
    assert snapshot(q) == before  # no error/, no dup.txt, no error.csv made


def test_output_into_a_missing_folder_is_not_found(sample_q: Path, tmp_path: Path) -> None:
    for cmd in (["schema", str(sample_q)], ["order-check", str(sample_q)]):
        r = invoke("dirq", *cmd, "-o", str(tmp_path / "no" / "out.txt"))
        assert r.returncode == 3, cmd
        _one_line_error(r)
    assert not (tmp_path / "no").exists()
