"""Hostile files through a real `onceq dirq consume`: each its own verdict, never a crash.

Before: a 5,000-digit integer crashed the run with a traceback (ValueError, not a
JSONDecodeError) and left every claimed file in processing/, where the next run took
it over and crashed again; an integer over 64 bits or a lone surrogate crashed the
commit of the whole group, innocent files included.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from cli_support import invoke
from support import open_db

HUGE = "9" * 5000
OVER_64 = "18446744073709551616"


def raw(msg_id: str, seq: str = "1", amount: str = "10", order_no: str = '"A-1"') -> bytes:
    return (
        f'{{"msg_id": {msg_id}, "order_no": {order_no}, "seq": {seq}, "amount": {amount}}}'
    ).encode()


# name -> (bytes, reason, words the ledger's detail holds)
HOSTILE: dict[str, tuple[bytes, str, str]] = {
    "h-huge-seq.json": (raw('"h1"', seq=HUGE), "parse", "4300 digits"),
    "h-huge-id.json": (raw(HUGE), "parse", "4300 digits"),
    "h-seq-64.json": (raw('"h2"', seq=OVER_64), "bad-type", "64-bit"),
    "h-amount-64.json": (raw('"h3"', amount="-" + OVER_64), "bad-type", "64-bit"),
    "h-surrogate-id.json": (raw('"s\\ud800x"'), "encoding", "msg_id"),
    "h-surrogate-order.json": (raw('"h4"', order_no='"\\udfff"'), "encoding", "order_no"),
    "h-deep.json": (b"[" * 100_000 + b"]" * 100_000, "parse", "nested too deeply"),
}
GOOD = {f"g-{i}.json": raw(f'"g-{i}"', seq=str(i)) for i in range(1, 4)}
# A valid message whose file name is not UTF-8: listdir gives it as surrogates.
ODD_NAME = os.fsdecode(b"g-\xff.json")
ODD_BAD = os.fsdecode(b"h-\xfe.json")  # and one that is also broken: error/, error.csv


def _queue(tmp_path: Path) -> Path:
    q = tmp_path / "q"
    r = invoke("dirq", "init", str(q))
    assert r.returncode == 0, r.stderr
    for name, body in {**GOOD, **{n: b for n, (b, _, _) in HOSTILE.items()}}.items():
        (q / "inbox" / name).write_bytes(body)
    (q / "inbox" / ODD_NAME).write_bytes(raw('"g-odd"', seq="9"))
    (q / "inbox" / ODD_BAD).write_bytes(b'{"msg_id": ')
    return q


def test_hostile_files_are_quarantined_and_the_run_finishes(tmp_path: Path) -> None:
    q = _queue(tmp_path)
    r = invoke("dirq", "consume", str(q), "--json")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    out = json.loads(r.stdout)
    assert (out["received"], out["processed"], out["quarantined"]) == (12, 4, 8)

    assert sorted(os.listdir(q / "error")) == sorted([*HOSTILE, ODD_BAD])
    assert sorted(os.listdir(q / "done")) == sorted([*GOOD, ODD_NAME])
    assert os.listdir(q / "inbox") == [] and os.listdir(q / "processing") == []

    with open_db(q / "ledger.db") as db:
        failures = {ref: (reason, detail) for ref, reason, detail in db.execute(
            "SELECT ref, reason, detail FROM failures WHERE action = 'dead'"
        )}  # fmt: skip
        processed = dict(db.execute("SELECT msg_id, ref FROM processed"))
    assert failures["h-\\udcfe.json"][0] == "parse"
    for name, (_, reason, words) in HOSTILE.items():
        assert failures[name][0] == reason, (name, failures[name])
        assert words in failures[name][1], (name, failures[name])
    assert processed == {
        "g-1": "g-1.json",
        "g-2": "g-2.json",
        "g-3": "g-3.json",
        "g-odd": "g-\\udcff.json",  # the name's bad byte, escaped in the ledger
    }

    r = invoke("dirq", "report", str(q))
    assert r.returncode == 0, r.stderr
    with open(q / "error.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["file", "reason"]
    assert dict(rows[1:]) == {
        **{name: reason for name, (_, reason, _) in HOSTILE.items()},
        "h-\\udcfe.json": "parse",
    }

    again = invoke("dirq", "consume", str(q), "--json")  # nothing left to crash on
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["received"] == 0


def test_a_quarantined_hostile_file_replayed_is_quarantined_again(tmp_path: Path) -> None:
    """Replay puts it back; the next run gives it the same verdict instead of crashing."""
    q = _queue(tmp_path)
    assert invoke("dirq", "consume", str(q)).returncode == 0
    r = invoke("dirq", "replay", str(q), "h-huge-seq.json")
    assert r.returncode == 0, r.stderr
    r = invoke("dirq", "consume", str(q), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["reasons"] == {"parse": 1}
    assert "h-huge-seq.json" in os.listdir(q / "error")
    assert os.listdir(q / "processing") == []
