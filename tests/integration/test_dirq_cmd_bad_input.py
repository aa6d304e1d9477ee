"""Every kind of bad file through a real `onceq dirq consume`: quarantined, never a crash.

Each file ends in error/ with its reason in the ledger's failures table and in
error.csv; the symlink's target outside the queue is neither read nor touched;
dotfiles and *.tmp (a producer's partial writes) stay in the inbox.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from pathlib import Path

from cli_support import invoke
from support import open_db

GOOD = {"msg_id": "m-1", "order_no": "A-1", "seq": 1, "amount": 10}
MAX_BYTES = 400


def _doc(**changes: object) -> bytes:
    doc = {**GOOD, **changes}
    return json.dumps({k: v for k, v in doc.items() if v is not ...}).encode()


# name -> (bytes, reason, a word the ledger's detail must contain)
BAD: dict[str, tuple[bytes, str, str]] = {
    "empty.json": (b"", "empty", ""),
    "blank.json": (b" \n\t \r\n", "empty", ""),
    "latin1.json": ('{"msg_id": "caf\u00e9"}'.encode("latin-1"), "encoding", "UTF-8"),
    "broken.json": (b'{"msg_id": "m-x", "seq": ', "parse", "line"),
    "array.json": (b'[{"msg_id": "m-a"}]', "not-object", "list"),
    "string.json": (b'"m-s"', "not-object", "str"),
    "seq-string.json": (_doc(msg_id="m-2", seq="3"), "bad-type", "seq"),
    "seq-float.json": (_doc(msg_id="m-3", seq=3.5), "bad-type", "seq"),
    "seq-bool.json": (_doc(msg_id="m-4", seq=True), "bad-type", "seq"),
    "amount-string.json": (_doc(msg_id="m-5", amount="12"), "bad-type", "amount"),
    "amount-nan.json": (
        b'{"msg_id": "m-6", "order_no": "A-1", "seq": 1, "amount": NaN}',
        "bad-type",
        "amount",
    ),
    "id-empty.json": (_doc(msg_id=""), "bad-type", "msg_id"),
    "no-order.json": (_doc(msg_id="m-7", order_no=...), "missing-field", "order_no"),
    "huge.json": (_doc(msg_id="m-8", pad="x" * MAX_BYTES), "too-large", str(MAX_BYTES)),
}


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file() and not p.is_symlink():
            h.update(p.read_bytes())
    return h.hexdigest()


def test_every_bad_file_is_quarantined_with_its_reason(tmp_path: Path) -> None:
    q = tmp_path / "q"
    assert invoke("dirq", "init", str(q)).returncode == 0
    inbox = q / "inbox"
    for name, (body, _, _) in BAD.items():
        (inbox / name).write_bytes(body)
    (inbox / "good.json").write_bytes(_doc())
    (inbox / "folder.json").mkdir()
    (inbox / "folder.json" / "inner.json").write_bytes(_doc(msg_id="m-inner"))
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.json"
    secret.write_bytes(_doc(msg_id="m-secret"))
    os.utime(secret, (1_000_000_000, 1_000_000_000))
    before = (secret.read_bytes(), secret.stat().st_mtime_ns, _tree_digest(outside))
    (inbox / "link.json").symlink_to(secret)
    (inbox / ".partial.json").write_bytes(_doc(msg_id="m-dot"))
    (inbox / "half.json.tmp").write_bytes(b'{"msg_id": "m-t')

    r = invoke("dirq", "consume", str(q), "--max-bytes", str(MAX_BYTES), "--json")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    stats = json.loads(r.stdout)
    expected = {n: reason for n, (_, reason, _) in BAD.items()}
    expected |= {"folder.json": "not-a-file", "link.json": "not-a-file"}
    assert stats["processed"] == 1
    assert stats["quarantined"] == len(expected)

    # The folders: everything bad in error/, the good one done, nothing left claimed.
    assert sorted(os.listdir(q / "error")) == sorted(expected)
    assert os.listdir(q / "done") == ["good.json"]
    assert os.listdir(q / "processing") == []
    assert sorted(os.listdir(inbox)) == [".partial.json", "half.json.tmp"]

    # The ledger: one failure per file with its reason, and the detail naming the problem.
    with open_db(q / "ledger.db") as conn:
        failures = {
            ref: (reason, detail)
            for ref, reason, detail in conn.execute("SELECT ref, reason, detail FROM failures")
        }
        processed = [r[0] for r in conn.execute("SELECT msg_id FROM processed")]
    assert {ref: reason for ref, (reason, _) in failures.items()} == expected
    for name, (_, _, word) in BAD.items():
        assert word in failures[name][1], (name, failures[name])
    assert failures["link.json"][1] == "symlink"
    assert failures["folder.json"][1] == "folder"
    assert processed == ["m-1"]

    # The symlink's target outside the queue: not read into the ledger, not touched.
    assert (secret.read_bytes(), secret.stat().st_mtime_ns, _tree_digest(outside)) == before
    assert (q / "error" / "link.json").is_symlink()

    # error.csv says the same as the ledger.
    r = invoke("dirq", "report", str(q))
    assert r.returncode == 0, r.stderr
    with open(q / "error.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["file", "reason"]
    assert dict(rows[1:]) == expected
    assert [r[0] for r in rows[1:]] == sorted(expected)
    assert (q / "dup.txt").read_text() == ""


def test_a_second_consume_leaves_the_quarantine_and_ledger_alone(tmp_path: Path) -> None:
    q = tmp_path / "q"
    invoke("dirq", "init", str(q))
    (q / "inbox" / "broken.json").write_bytes(b"{")
    assert invoke("dirq", "consume", str(q)).returncode == 0
    with open_db(q / "ledger.db") as conn:
        first = conn.execute("SELECT ref, reason FROM failures").fetchall()
    assert invoke("dirq", "consume", str(q)).returncode == 0
    with open_db(q / "ledger.db") as conn:
        assert conn.execute("SELECT ref, reason FROM failures").fetchall() == first
    assert first == [("broken.json", "parse")]
