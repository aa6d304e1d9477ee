"""The generic message spec, and the presets against 0.1.0's decoders (the oracle).

The oracle is tests/decoders_0_1_0.py: 0.1.0's two decoders, verbatim. Whatever
bytes or JSON hypothesis makes, the orders and claims presets must give the same
Kind, reason, detail, id and recorded values, so no exercise changes behaviour.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import decoders_0_1_0 as oracle
from onceq._core.message import MessageSpec
from onceq._core.transport import Delivery, Kind
from onceq._exercise.presets import CLAIMS, ORDERS, OrdersSpec
from onceq.errors import UsageError

# --- the oracle -----------------------------------------------------------------------

KEYS = ["msg_id", "order_no", "seq", "amount", "guid", "claimId", "docs", "x"]
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 0])
    | st.floats(allow_nan=True, allow_infinity=True)
    # lone surrogates and control characters included: json.dumps escapes them
    | st.text(max_size=6)
    | st.sampled_from(["", " ", "a\nb", "\x00", "\ud800", "x\udfff", "\x7f", "é"])
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
docs = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=3), values, max_size=6)


@st.composite
def bodies(draw: Any) -> bytes:
    """JSON objects near an order or a claim, other JSON, or arbitrary bytes."""
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return bytes(draw(st.binary(max_size=40)))
    if choice == 1:
        return json.dumps(draw(values)).encode()
    doc = draw(docs)
    base = {"msg_id": "m", "order_no": "A", "seq": 1, "amount": 2.5, "guid": "g", "claimId": "C"}
    if choice >= 7:  # one field of a valid message made hostile: each check in turn
        doc = {**base, draw(st.sampled_from(KEYS)): draw(scalars)}
    elif choice >= 4:  # mostly near-valid: the interesting checks come after parsing
        doc = {**base, **doc}
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()))
    prefix = draw(st.sampled_from(["", " ", "\ufeff", "\n"]))
    try:
        return (prefix + text).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate written raw: the bytes say so
        return (prefix + text).encode("utf-8", "surrogatepass")


def _file(body: bytes, **headers: Any) -> Delivery:
    return Delivery(body=body, ref="x.json", headers={"kind": "file", "size": len(body), **headers})


def _same_orders(body: bytes, old_spec: Any, new_spec: Any, **headers: Any) -> None:
    d_old, d_new = _file(body, **headers), _file(body, **headers)
    old = oracle.dirq_decode(d_old, old_spec)
    new = new_spec.decode(d_new)
    assert (new.kind, new.reason, new.detail) == (old.kind, old.reason, old.detail), body
    assert d_new.msg_id == d_old.msg_id
    if old.kind is Kind.SUCCESS:
        f = new.fields
        assert (f["group"], f["seq"], f["kept"].get("amount")) == (
            old.fields["order_no"],
            old.fields["seq"],
            old.fields["amount"],
        )
        assert f["doc"] == json.loads(body.decode("utf-8-sig"))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies())
def test_orders_preset_decodes_as_0_1_0(body: bytes) -> None:
    _same_orders(body, oracle.MessageSpec(), ORDERS)


@settings(max_examples=300, deadline=None)
@given(
    bodies(),
    st.lists(st.sampled_from(["msg_id", "order_no", "seq", "amount", "x"]), unique=True),
    st.integers(1, 60),
)
def test_orders_preset_with_other_required_fields_and_sizes_decodes_as_0_1_0(
    body: bytes, required: list[str], max_bytes: int
) -> None:
    """`dirq consume --required … --max-bytes …` builds OrdersSpec(required=…, max_bytes=…)."""
    old = oracle.MessageSpec(required=tuple(required), max_bytes=max_bytes)
    _same_orders(body, old, OrdersSpec(required=tuple(required), max_bytes=max_bytes))


@pytest.mark.parametrize(
    "headers",
    [
        {"kind": "unreadable", "detail": "Permission denied"},
        {"kind": "symlink"},
        {"kind": "folder"},
        {"kind": "special"},
        {"size": 10**9},
    ],
)
def test_orders_preset_refuses_what_is_not_a_readable_file_as_0_1_0(headers: dict) -> None:
    _same_orders(b'{"msg_id": "m"}', oracle.MessageSpec(), ORDERS, **headers)


message_ids = st.none() | st.sampled_from(["", "  ", "p", " p ", "a\x00b", "\udcff", "é", "a\nb"])


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies(), message_ids)
def test_claims_preset_decodes_as_0_1_0(body: bytes, message_id: str | None) -> None:
    headers = {"message_id": message_id, "delivery_tag": 1}
    d_old = Delivery(body=body, ref="1", headers=dict(headers))
    d_new = Delivery(body=body, ref="1", headers=dict(headers))
    old = oracle.amqp_decode(d_old)
    new = CLAIMS.decode(d_new)
    assert (new.kind, new.reason, new.detail) == (old.kind, old.reason, old.detail), body
    assert d_new.msg_id == d_old.msg_id
    if old.kind is Kind.SUCCESS:
        f = new.fields
        assert f["group"] == old.fields["order_no"]
        assert f["kept"].get("amount") == old.fields["amount"]
        assert f["seq"] is None


# --- the generic spec -----------------------------------------------------------------

INVOICES = MessageSpec(
    id_field="invoice.id",
    required=("customer.name", "total"),
    group_field="customer.name",
    seq_field="seq",
    keep=("total", "customer.name", "lines"),
)


def _decode(spec: MessageSpec, doc: Any, **headers: Any) -> tuple[Delivery, Any]:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    d = Delivery(body=body, ref="r", headers=headers)
    return d, spec.decode(d)


def test_a_dotted_id_group_seq_and_kept_values() -> None:
    doc = {
        "invoice": {"id": "INV-1"},
        "customer": {"name": "ACME"},
        "total": 120.5,
        "seq": 3,
        "lines": [{"sku": "a", "n": 2}],
        "note": "not kept",
    }
    d, out = _decode(INVOICES, doc)
    assert out.kind is Kind.SUCCESS, out
    assert d.msg_id == "INV-1"
    assert out.fields == {
        "group": "ACME",
        "seq": 3,
        "kept": {"total": 120.5, "customer.name": "ACME", "lines": [{"sku": "a", "n": 2}]},
        "doc": doc,
    }


def test_an_integer_id_is_its_decimal_text_and_absent_kept_paths_are_left_out() -> None:
    d, out = _decode(INVOICES, {"invoice": {"id": 7}, "customer": {"name": "A"}, "total": 1})
    assert d.msg_id == "7"
    assert out.fields["kept"] == {"total": 1, "customer.name": "A"}
    assert out.fields["seq"] is None


def inv(**changes: Any) -> dict[str, Any]:
    """An invoice for INVOICES with changes (a value of ... drops that key)."""
    doc = {"invoice": {"id": "I"}, "customer": {"name": "A"}, "total": 1, **changes}
    return {k: v for k, v in doc.items() if v is not ...}


@pytest.mark.parametrize(
    ("doc", "reason", "detail"),
    [
        (inv(invoice=...), "missing-field", "invoice.id"),
        (inv(invoice={}), "missing-field", "invoice.id"),
        (inv(invoice="INV-1"), "missing-field", "invoice.id"),
        (inv(customer=...), "missing-field", "customer.name"),
        (inv(customer={"name": None}, total=...), "missing-field", "customer.name,total"),
        (inv(customer=["name"]), "missing-field", "customer.name"),
        (inv(invoice={"id": ""}), "bad-type", "invoice.id must be a non-empty string"),
        (inv(invoice={"id": 1.5}), "bad-type", "invoice.id must"),
        (inv(invoice={"id": True}), "bad-type", "invoice.id must"),
        (inv(invoice={"id": None}), "bad-type", "invoice.id must"),
        (inv(invoice={"id": "a\nb"}), "bad-type", "invoice.id holds a control character"),
        (inv(invoice={"id": "a\x00"}), "bad-type", "control"),
        (inv(seq="1"), "bad-type", "seq must be an integer"),
        (inv(seq=2**63), "bad-type", "seq is outside the 64-bit"),
        (inv(total=2**64), "bad-type", "total is outside the 64-bit"),
        (inv(lines=[[-(2**64)]]), "bad-type", "lines is outside the 64-bit"),
        (inv(total=float("inf")), "bad-type", "total must be a finite number"),
        (inv(invoice={"id": "s\ud800"}), "encoding", "invoice.id holds a lone surrogate"),
        (inv(customer={"name": "\udfff"}), "encoding", "customer.name holds a lone surrogate"),
        (inv(lines={"\ud800": 1}), "encoding", "lines holds a lone surrogate"),
        ([1], "not-object", "list"),
        (b"", "empty", ""),
        (b"\xff", "encoding", "not UTF-8"),
        (b"{", "parse", "line 1"),
    ],
)
def test_each_bad_message_has_its_reason_naming_the_path(
    doc: Any, reason: str, detail: str
) -> None:
    d, out = _decode(INVOICES, doc)
    assert (out.kind, out.reason) == (Kind.REJECTED, reason), out
    assert detail in out.detail
    assert d.msg_id is None


@pytest.mark.parametrize(
    ("rule", "good", "bad", "detail"),
    [
        ("key", "k", " ", "must be a non-empty string or an integer"),
        ("integer", 5, 5.0, "must be an integer"),
        ("number", 5.5, "5", "must be a finite number"),
        ("string", "", 5, "must be a string"),
    ],
)
def test_types_are_checked_where_present(rule: str, good: Any, bad: Any, detail: str) -> None:
    spec = MessageSpec(id_field="id", types={"a.b": rule})
    assert _decode(spec, {"id": "1", "a": {"b": good}})[1].kind is Kind.SUCCESS
    assert _decode(spec, {"id": "1"})[1].kind is Kind.SUCCESS  # absent: required decides
    out = _decode(spec, {"id": "1", "a": {"b": bad}})[1]
    assert (out.reason, out.detail) == ("bad-type", f"a.b {detail}")


def test_a_lenient_number_is_kept_only_when_storable_and_never_rejects() -> None:
    spec = MessageSpec(id_field="id", keep=("n",), types={"n": "lenient-number"})
    for value, kept in [(1.5, {"n": 1.5}), ("x", {}), (2**64, {}), (True, {}), (None, {})]:
        out = _decode(spec, {"id": "1", "n": value})[1]
        assert out.kind is Kind.SUCCESS and out.fields["kept"] == kept


def test_with_id_property_the_message_id_comes_first_then_the_dotted_field() -> None:
    spec = MessageSpec(id_field="meta.id", id_property=True)
    d, out = _decode(spec, {"meta": {"id": "body"}}, message_id="prop")
    assert out.kind is Kind.SUCCESS and d.msg_id == "prop"
    d, out = _decode(spec, {"meta": {"id": "body"}}, message_id="")
    assert d.msg_id == "body"
    for doc, reason, detail in [
        ({}, "missing-id", "no message_id property and no meta.id"),
        ({"meta": {"id": ["x"]}}, "bad-id", "meta.id is a list"),
        ({"meta": {"id": "a\rb"}}, "bad-id", "control character"),
        ({"meta": {"id": "\ud800"}}, "encoding", "lone surrogate"),
    ]:
        out = _decode(spec, doc)[1]
        assert (out.reason, out.detail) == (reason, detail) or detail in out.detail, out
        assert out.reason == reason


def test_a_message_over_max_bytes_is_refused_before_parsing() -> None:
    out = _decode(MessageSpec(max_bytes=10), {"msg_id": "long enough"})[1]
    assert (out.reason, out.detail) == ("too-large", "25 bytes > 10")


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"id_field": None}, "id_field"),
        ({"id_field": "a..b"}, "'a..b'"),
        ({"required": ("",)}, "required"),
        ({"keep": ("a. b",)}, "keep"),
        ({"types": {"a": "date"}}, "types.a"),
        ({"max_bytes": 0}, "max_bytes"),
    ],
)
def test_a_spec_that_cannot_work_is_a_usage_error_naming_the_item(kwargs: dict, says: str) -> None:
    with pytest.raises(UsageError, match="message spec") as exc:
        MessageSpec(**kwargs)
    assert says in str(exc.value) and "\n" not in str(exc.value)


specs = st.builds(
    MessageSpec,
    id_field=st.sampled_from(["msg_id", "a.b", "guid", "x.y.z"]),
    id_property=st.booleans(),
    required=st.lists(st.sampled_from(["a", "a.b", "seq", "x"]), max_size=3).map(tuple),
    group_field=st.none() | st.sampled_from(["order_no", "a", "a.b"]),
    seq_field=st.none() | st.sampled_from(["seq", "a.b"]),
    keep=st.lists(st.sampled_from(["amount", "a", "x", "docs"]), max_size=3).map(tuple),
    types=st.dictionaries(st.sampled_from(["a", "amount", "x.y"]), st.sampled_from(
        ["key", "integer", "number", "string", "lenient-number"]), max_size=2),
    max_bytes=st.integers(1, 200),
)  # fmt: skip


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs, bodies(), message_ids)
def test_any_spec_on_any_input_gives_a_verdict_never_an_exception(
    spec: MessageSpec, body: bytes, message_id: str | None
) -> None:
    d = Delivery(body=body, ref="r", headers={"message_id": message_id})
    out = spec.decode(d)
    if out.kind is Kind.SUCCESS:
        assert isinstance(d.msg_id, str) and d.msg_id.encode("utf-8")
        f = out.fields
        assert set(f) == {"group", "seq", "kept", "doc"}
        assert f["group"] is None or isinstance(f["group"], str)
        # what the ledger stores must be storable: JSON text that encodes as UTF-8
        json.dumps(f["kept"], ensure_ascii=False, allow_nan=False).encode("utf-8")
        if f["group"] is not None:
            f["group"].encode("utf-8")
    else:
        assert out.kind is Kind.REJECTED and out.reason and d.msg_id is None


def test_a_deeply_nested_kept_value_is_checked_without_recursion() -> None:
    """As deep as json.loads allows: the storability walk must not raise RecursionError."""
    depth = 900
    body = b'{"id": "1", "k": ' + b"[" * depth + b"1" + b"]" * depth + b"}"
    spec = MessageSpec(id_field="id", keep=("k",))
    out = spec.decode(Delivery(body=body, ref="r", headers={}))
    assert out.kind is Kind.SUCCESS
    bad = body.replace(b"1]", str(2**64).encode() + b"]", 1)
    out = spec.decode(Delivery(body=bad, ref="r", headers={}))
    assert (out.reason, out.detail) == ("bad-type", "k is outside the 64-bit integer range")


def test_a_spec_is_a_value_hashable_and_not_changed_by_its_caller_s_dict() -> None:
    types = {"a": "integer"}
    spec = MessageSpec(types=types)
    types["a"] = "string"
    assert spec.types == {"a": "integer"}
    assert _decode(spec, {"msg_id": "1", "a": "x"})[1].reason == "bad-type"
    assert hash(ORDERS) == hash(OrdersSpec()) and {ORDERS: 1}[OrdersSpec()] == 1
    assert MessageSpec(types={"a": "key"}) == MessageSpec(types={"a": "key"})


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([b"", b"\xef\xbb\xbf", b"\xef\xbb", b"\xef\xbb\xbf\xef\xbb\xbf"]),
    st.binary(max_size=8),
)
def test_the_bom_strip_is_the_utf8_sig_codec(prefix: bytes, rest: bytes) -> None:
    """decode's own BOM strip gives what bytes.decode("utf-8-sig") gives, errors too."""
    from onceq._core.message import _utf8_sig

    def outcome(f: Any) -> Any:
        try:
            return f(prefix + rest)
        except UnicodeDecodeError as exc:
            return (exc.start, exc.end, exc.reason, str(exc))

    assert outcome(_utf8_sig) == outcome(lambda b: b.decode("utf-8-sig"))
