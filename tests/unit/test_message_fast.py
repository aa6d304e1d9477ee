"""The message spec's fast path says yes only where its full path says the same yes.

`MessageSpec.decode` first tries `_accept` (a message whose paths are all top-level
keys, every check surely passed, read by json's scanner directly) and falls back to
`_decode_all` (every check, in order, each refusal in its words) for anything else.
Here both are fed hostile bytes and JSON under specs that use every rule: the fast
path answers None or exactly the full path's SUCCESS (fields, kept values, msg_id),
and decode's verdict is always the full path's.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onceq._core.message import MessageSpec
from onceq._core.transport import Delivery, Kind
from onceq._exercise.presets import CLAIMS, ORDERS

KEYS = ["msg_id", "order_no", "seq", "amount", "guid", "claimId", "note", "x"]

SPECS = [
    ORDERS,
    CLAIMS,
    MessageSpec(),  # the id alone, under the generic id rule (no control character)
    MessageSpec(
        id_field="guid",
        required=("claimId",),
        group_field="claimId",
        seq_field="seq",
        keep=("amount", "note", "x"),
        types={"amount": "lenient-number", "note": "string", "x": "key"},
    ),
    MessageSpec(
        id_field="msg_id",
        keep=("amount", "x"),
        types={"msg_id": "integer", "amount": "number", "x": "lenient-number"},
        max_bytes=60,
    ),
    MessageSpec(id_field="guid", id_property=True, group_field="order_no", keep=("x",)),
    MessageSpec(id_field="guid", id_property=True, types={"guid": "string"}),
    MessageSpec(id_field="a.b", keep=("x",)),  # dotted: no fast path at all
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 0, 10**400])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6)
    | st.sampled_from(["", " ", "\u2028", "a\nb", "\x00", "\ud800", "x\udfff", "\x7f", "é"])
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def bodies(draw: Any) -> bytes:
    """Mostly near-valid objects with one hostile field, some other JSON or bytes."""
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return bytes(draw(st.binary(max_size=40)))
    if choice == 1:
        return json.dumps(draw(values)).encode()
    base = {"msg_id": "m", "order_no": "A", "seq": 1, "amount": 2.5, "guid": "g", "claimId": "C"}
    doc = {**base, **draw(st.dictionaries(st.sampled_from(KEYS), values, max_size=3))}
    if draw(st.booleans()):
        doc.pop(draw(st.sampled_from(KEYS)), None)
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()))
    text = draw(st.sampled_from(["", " ", "\ufeff", "\n"])) + text
    text += draw(st.sampled_from(["", "\n", " \t\r\n", "\x0c", " x", "{}"]))
    return text.encode("utf-8", "surrogatepass")


message_ids = st.none() | st.sampled_from(["", "  ", "p", " p ", "a\x00b", "\udcff", "é", 7])
kinds = st.sampled_from([{}, {"kind": "file"}, {"kind": "folder"}, {"size": 10**9}])


def _outcome(spec: MessageSpec, body: bytes, headers: dict[str, Any], fast: bool) -> Any:
    d = Delivery(body=body, ref="x.json", headers={"size": len(body), **headers})
    try:
        out = spec._accept(d) if fast else spec._decode_all(d)
    except Exception as exc:  # the loop makes it internal-error (decode_safely): alike
        return (type(exc), str(exc))
    if out is None:
        return None
    return (out.kind, out.reason, out.detail, out.fields, d.msg_id)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies(), st.sampled_from(range(len(SPECS))), message_ids, kinds)
def test_the_fast_path_accepts_only_what_the_full_path_accepts_alike(
    body: bytes, which: int, message_id: Any, kind: dict[str, Any]
) -> None:
    spec = SPECS[which]
    headers = {**kind, **({"message_id": message_id} if spec.id_property else {})}
    full = _outcome(spec, body, headers, fast=False)
    fast = _outcome(spec, body, headers, fast=True) if spec._flat is not None else None
    if fast is not None:
        assert fast == full, body
    d = Delivery(body=body, ref="x.json", headers={"size": len(body), **headers})
    try:
        out = spec.decode(d)
    except Exception as exc:
        assert (type(exc), str(exc)) == full, body
    else:
        assert (out.kind, out.reason, out.detail, out.fields, d.msg_id) == full, body


def test_an_ordinary_message_takes_the_fast_path() -> None:
    """Not dead code: the orders and claims presets' usual messages are accepted fast."""
    order = b'{"msg_id": "m-1", "order_no": "A-1", "seq": 3, "amount": 2.5}\n'
    d = Delivery(body=order, ref="x.json", headers={"kind": "file", "size": len(order)})
    out = ORDERS._accept(d)
    assert out is not None and out.kind is Kind.SUCCESS
    assert d.msg_id == "m-1"
    assert out.fields["group"] == "A-1" and out.fields["kept"] == {"amount": 2.5}
    claim = b'{"guid": "g-1", "claimId": "C-1", "amount": 10}'
    d = Delivery(body=claim, ref="1", headers={"message_id": "p-1"})
    out = CLAIMS._accept(d)
    assert out is not None and d.msg_id == "p-1"


def test_a_dotted_spec_has_no_fast_path() -> None:
    assert MessageSpec(id_field="invoice.id")._flat is None
    assert MessageSpec(group_field="customer.name")._flat is None
    assert ORDERS._flat is not None
