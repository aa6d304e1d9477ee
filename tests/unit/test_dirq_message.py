"""The decoder's verdict on each kind of file, and the schema/order helpers over it."""

from __future__ import annotations

import json
import sqlite3

import pytest

from onceq._core.transport import Delivery, Kind
from onceq._exercise.orders_0_1_0 import MessageSpec, decode
from onceq._sources.dirq.order import DEFAULT_SQL, render
from onceq._sources.dirq.schema import infer, json_type, merge_types

GOOD = {"msg_id": "m-1", "order_no": "A-1", "seq": 1, "amount": 10}


def _decode(body: bytes, spec: MessageSpec | None = None, **headers: object):
    d = Delivery(body=body, ref="x.json", headers={"kind": "file", "size": len(body), **headers})
    return d, decode(d, spec or MessageSpec())


def _with(**changes: object) -> bytes:
    doc = {**GOOD, **changes}
    return json.dumps({k: v for k, v in doc.items() if v is not ...}).encode()


def test_a_normal_message_sets_its_id_and_fields() -> None:
    d, out = _decode(_with(amount=12.5))
    assert out.kind is Kind.SUCCESS
    assert d.msg_id == "m-1"
    doc = {"msg_id": "m-1", "order_no": "A-1", "seq": 1, "amount": 12.5}
    assert out.fields == {"group": "A-1", "seq": 1, "kept": {"amount": 12.5}, "doc": doc}


@pytest.mark.parametrize(
    ("body", "reason", "detail_has"),
    [
        (b"", "empty", ""),
        (b"  \n\t\r\n ", "empty", ""),
        (b'{"msg_id": "\xff\xfe"}', "encoding", "UTF-8"),
        (b'{"msg_id": "m-1", ', "parse", "line 1"),
        (b"[1, 2, 3]", "not-object", "list"),
        (b'"just a string"', "not-object", "str"),
        (b"42", "not-object", "int"),
        (_with(seq="3"), "bad-type", "seq"),
        (_with(seq=3.5), "bad-type", "seq"),
        (_with(seq=True), "bad-type", "seq"),
        (_with(amount="12"), "bad-type", "amount"),
        (_with(amount=True), "bad-type", "amount"),
        (b'{"msg_id": "m-1", "order_no": "A", "seq": 1, "amount": NaN}', "bad-type", "amount"),
        (b'{"msg_id": "m-1", "order_no": "A", "seq": 1, "amount": Infinity}', "bad-type", "amount"),
        (_with(msg_id=""), "bad-type", "msg_id"),
        (_with(msg_id="   "), "bad-type", "msg_id"),
        (_with(msg_id=None), "missing-field", "msg_id"),
        (_with(amount=...), "missing-field", "amount"),
        (_with(order_no=..., seq=...), "missing-field", "order_no,seq"),
    ],
)
def test_each_bad_file_is_rejected_with_its_reason(
    body: bytes, reason: str, detail_has: str
) -> None:
    d, out = _decode(body)
    assert out.kind is Kind.REJECTED
    assert out.reason == reason
    assert detail_has in out.detail
    assert d.msg_id is None  # a rejected file never claims an id in the ledger


def test_size_limit_and_file_kind_are_checked_before_reading() -> None:
    spec = MessageSpec(max_bytes=10)
    assert _decode(_with(), spec)[1].reason == "too-large"
    assert _decode(b"", kind="symlink")[1].reason == "not-a-file"
    assert _decode(b"", kind="folder")[1].reason == "not-a-file"


def test_json_type_names() -> None:
    values = [None, True, 1, 1.5, "s", [1], {"a": 1}]
    names = ["null", "boolean", "integer", "number", "string", "array", "object"]
    assert [json_type(v) for v in values] == names


def test_integer_mixed_with_number_is_number_other_mixes_show_both() -> None:
    assert merge_types(["integer", "number", "integer"]) == "number"
    assert merge_types(["integer"]) == "integer"
    assert merge_types(["string", "integer"]) == "integer|string"


def test_schema_rows_in_first_seen_order_with_roles() -> None:
    docs = [
        {"msg_id": "a", "order_no": "A", "seq": 1, "amount": 1},
        {"msg_id": "b", "order_no": "A", "seq": 2, "amount": 2.5, "tags": ["x"], "vip": False},
        {"msg_id": "c", "meta": {"k": 1}, "seq": 3, "amount": 3},
    ]
    assert infer(docs) == [
        ("msg_id", "string", "idempotency-key"),
        ("order_no", "string", ""),
        ("seq", "integer", "sequence"),
        ("amount", "number", ""),
        ("tags", "array", ""),
        ("vip", "boolean", ""),
        ("meta", "object", ""),
    ]


def _order_rows(rows: list[tuple[str, str, int | None]]) -> list[tuple]:
    """The default order query over a `processed` table holding rows (msg_id, order, seq)."""
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE processed (msg_id TEXT PRIMARY KEY, order_no TEXT, seq INTEGER)")
    conn.executemany("INSERT INTO processed VALUES (?,?,?)", rows)
    return conn.execute(DEFAULT_SQL).fetchall()


def test_order_query_finds_repeats_gaps_late_starts_and_missing_seq() -> None:
    rows = _order_rows(
        [
            ("m1", "A", 1),
            ("m2", "A", 2),
            ("m3", "A", 2),
            ("m4", "A", 5),
            ("m5", "B", 3),
            ("m6", "C", 1),
            ("m7", "C", None),
            ("m8", "D", 0),
            ("m9", "D", 1),
        ]
    )
    assert rows == [
        ("A", "repeated", 2, 2, 2, "m2 m3"),
        ("A", "gap", 3, 4, 2, ""),
        ("B", "gap", 1, 2, 2, ""),
        ("C", "no-seq", None, None, 1, "m7"),
        ("D", "below-start", 0, 0, 1, "m8"),
    ]


def test_order_query_is_silent_on_complete_sequences() -> None:
    assert _order_rows([("m1", "A", 1), ("m2", "A", 2), ("m3", "B", 1), ("m4", "A", 3)]) == []


def test_render_is_ok_alone_or_header_and_rows() -> None:
    assert render(["a"], []) == "OK\n"
    assert render(["order_no", "n"], [("A,1", 2), ("B", None)]) == 'order_no,n\n"A,1",2\nB,\n'
