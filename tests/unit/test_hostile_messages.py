"""One hostile message is that message's verdict, never the run's (issue 6, item 3).

Each decoder is fed what the JSON parser, SQLite and HTTP headers choke on: integers
of more than 4300 digits (a plain ValueError, not a JSONDecodeError), integers beyond
64 bits (OverflowError at the commit), lone surrogates (UnicodeEncodeError at the
commit), deep nesting (RecursionError). Then the loop and the ledger are driven with
arbitrary bytes and arbitrary JSON (hypothesis), over the memory transport and a real
directory queue: every message gets a verdict, the run never raises, and the good
messages of the same group are recorded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onceq._core.consumer import Consumer, Outcome, no_effect
from onceq._core.transport import Delivery, Kind, Settle
from onceq._exercise import claims_0_1_0 as amqp
from onceq._exercise import orders_0_1_0 as dirq
from onceq._exercise.processed_table import PROCESSED_TABLE
from onceq._ledger.sqlite import Entry, Ledger
from onceq._sources.dirq.files import write_atomic
from onceq._sources.dirq.queue import DirQueue
from onceq._sources.dirq.worker import Worker
from onceq._sources.memory import MemoryTransport
from onceq.errors import LedgerError

HUGE = "9" * 5000  # over Python's 4300-digit int conversion limit
OVER_64 = "18446744073709551616"  # 2**64
DEEP = "[" * 100_000 + "]" * 100_000


def order(msg_id: str = "m-1", **changes: Any) -> dict[str, Any]:
    return {"msg_id": msg_id, "order_no": "A-1", "seq": 1, "amount": 10, **changes}


def raw(msg_id: str = '"m-1"', seq: str = "1", amount: str = "10", order_no: str = '"A"') -> bytes:
    """A message written by hand, so that a value json.dumps cannot write goes in."""
    return (
        f'{{"msg_id": {msg_id}, "order_no": {order_no}, "seq": {seq}, "amount": {amount}}}'
    ).encode()


def file_delivery(body: bytes, ref: str = "x.json") -> Delivery:
    return Delivery(
        body=body, ref=ref, stable_ref=True, headers={"kind": "file", "size": len(body)}
    )


# --- the decoders ---------------------------------------------------------------------

DIRQ_CASES = [
    (raw(seq=HUGE), "parse", "4300 digits"),
    (raw(amount=HUGE), "parse", "4300 digits"),
    (raw(msg_id=HUGE), "parse", "4300 digits"),
    (DEEP.encode(), "parse", "nested too deeply"),
    (b'{"a": ' * 50_000 + b"1" + b"}" * 50_000, "parse", "nested too deeply"),
    (raw(seq=OVER_64), "bad-type", "seq is outside the 64-bit"),
    (raw(seq="-" + OVER_64), "bad-type", "seq is outside the 64-bit"),
    (raw(amount=OVER_64), "bad-type", "amount is outside the 64-bit"),
    (raw(msg_id='"s\\ud800x"'), "encoding", "msg_id holds a lone surrogate"),
    (raw(order_no='"\\udfff"'), "encoding", "order_no holds a lone surrogate"),
    (raw(amount="NaN"), "bad-type", "finite"),
    (raw(amount="Infinity"), "bad-type", "finite"),
    (raw(amount="1e999"), "bad-type", "finite"),
    (raw(seq="NaN"), "bad-type", "seq must be an integer"),
    (b'"just a string"', "not-object", "str"),
    (b"[1, 2]", "not-object", "list"),
    (b"\x00\x00", "parse", ""),
]


@pytest.mark.parametrize(("body", "reason", "detail_has"), DIRQ_CASES)
def test_dirq_decoder_gives_each_hostile_body_its_reason(
    body: bytes, reason: str, detail_has: str
) -> None:
    d = file_delivery(body)
    out = dirq.decode(d, dirq.MessageSpec(max_bytes=10 * 2**20))
    assert (out.kind, out.reason) == (Kind.REJECTED, reason), out
    assert detail_has in out.detail
    assert d.msg_id is None  # nothing later looks up an id that was refused


def test_dirq_decoder_keeps_what_fits() -> None:
    """The limits are exactly SQLite's: 2**63-1 and -2**63 are accepted, NUL is text."""
    d = file_delivery(raw(msg_id='"a\\u0000b"', seq=str(2**63 - 1), amount=str(-(2**63))))
    out = dirq.decode(d, dirq.MessageSpec())
    assert out.kind is Kind.SUCCESS, out
    assert d.msg_id == "a\x00b" and out.fields["seq"] == 2**63 - 1


AMQP_CASES = [
    ({}, b'{"guid": "g", "n": ' + HUGE.encode() + b"}", "parse", "4300 digits"),
    ({}, DEEP.encode(), "parse", "RecursionError"),
    ({}, b"\xff\xfe", "parse", "UnicodeDecodeError"),
    ({}, b"[]", "not-object", "list"),
    ({}, b'{"claimId": "C"}', "missing-id", ""),
    ({"message_id": ""}, b'{"claimId": "C"}', "missing-id", ""),
    ({"message_id": "   "}, b'{"guid": "  "}', "missing-id", ""),
    ({}, b'{"guid": ["a"]}', "bad-id", "list"),
    ({}, b'{"guid": true}', "bad-id", "bool"),
    ({}, b'{"guid": 1.5}', "bad-id", "float"),
    ({}, b'{"guid": "s\\ud800x"}', "encoding", "not UTF-8"),
    ({"message_id": "\udcff\udcfe"}, b'{"guid": "g"}', "encoding", "not UTF-8"),
    ({}, b'{"guid": "a\\nb"}', "bad-id", "control character"),
    ({"message_id": "a\x00b"}, b"{}", "bad-id", "control character"),
    ({}, b'{"guid": "g", "claimId": "\\udfff"}', "encoding", "claimId"),
]


@pytest.mark.parametrize(("headers", "body", "reason", "detail_has"), AMQP_CASES)
def test_amqp_decoder_gives_each_hostile_message_its_reason(
    headers: dict[str, Any], body: bytes, reason: str, detail_has: str
) -> None:
    d = Delivery(body=body, ref="claim.in/1", headers=headers)
    out = amqp.decode(d)
    assert (out.kind, out.reason) == (Kind.REJECTED, reason), out
    assert detail_has in out.detail
    assert d.msg_id is None


def test_amqp_decoder_falls_back_to_the_guid_and_drops_amounts_it_cannot_store() -> None:
    d = Delivery(body=b'{"guid": "g-1", "amount": ' + OVER_64.encode() + b"}", ref="r")
    out = amqp.decode(d)
    assert out.kind is Kind.SUCCESS and d.msg_id == "g-1"
    assert out.fields["kept"] == {}  # SQLite would refuse it; it is only for reports
    d = Delivery(body=b'{"guid": "g", "amount": 1e999}', ref="r", headers={"message_id": "p"})
    assert amqp.decode(d).fields["kept"] == {} and d.msg_id == "p"


# --- the loop: a decoder that raises --------------------------------------------------


def _doc_decode(d: Delivery) -> Outcome:
    doc = json.loads(d.body)  # raises on purpose for anything unexpected
    if doc.get("boom"):
        raise RuntimeError("a bug in the decoder")
    d.msg_id = doc["msg_id"]
    return Outcome(Kind.SUCCESS, fields={"seq": doc.get("seq")})


async def _ok(d: Delivery, fields: dict[str, Any]) -> Outcome:
    return Outcome(Kind.SUCCESS, fields=fields)


@pytest.mark.parametrize("handler", [no_effect, _ok], ids=["no_effect", "handler"])
def test_an_exception_in_the_decoder_is_that_message_s_dead_letter(
    tmp_path: Path, handler: Any
) -> None:
    t = MemoryTransport()
    t.publish(json.dumps(order("m-1")).encode(), ref="good-1")
    t.publish(b'{"msg_id": "x", "seq": ' + HUGE.encode() + b"}", ref="huge")  # ValueError
    t.publish(json.dumps({"boom": 1, "msg_id": "b"}).encode(), ref="boom")  # RuntimeError
    t.publish(b"[]", ref="list")  # AttributeError in the decoder
    t.publish(json.dumps(order("m-2")).encode(), ref="good-2")
    with Ledger(tmp_path / "l.db") as ledger:
        consumer = Consumer(t, ledger, _doc_decode, handler, max_group=10)
        stats = asyncio.run(asyncio.wait_for(consumer.run(), 30))
        assert sorted(d.ref for d in t.acked) == ["good-1", "good-2"]
        assert sorted((d.ref, r) for d, r in t.dead) == [
            ("boom", "internal-error"),
            ("huge", "internal-error"),
            ("list", "internal-error"),
        ]
        assert ledger.counts()["processed"] == 2
        assert {r["ref"]: r["detail"] for r in ledger.dead_letters()} == {
            "boom": "decode: RuntimeError",
            "huge": "decode: ValueError",
            "list": "decode: AttributeError",
        }
        assert all(r["msg_id"] is None for r in ledger.dead_letters())  # "b" was never set
    assert (stats.processed, stats.dead, stats.reasons["internal-error"]) == (2, 3, 3)


def test_a_decoder_s_exception_is_one_line_and_its_traceback_only_at_debug(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug report per message, never a traceback on stderr at the default level."""
    t = MemoryTransport()
    t.publish(json.dumps({"boom": 1, "msg_id": "b"}).encode(), ref="boom")
    caplog.set_level(logging.DEBUG, logger="onceq")
    with Ledger(tmp_path / "l.db") as ledger:
        asyncio.run(asyncio.wait_for(Consumer(t, ledger, _doc_decode, no_effect).run(), 30))
    mine = [r for r in caplog.records if getattr(r, "event", None) == "decoder-failed"]
    errors = [r for r in mine if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and errors[0].exc_info is None
    line = errors[0].getMessage()
    assert "RuntimeError: a bug in the decoder" in line and "boom" in line
    assert "--log-level debug" in line
    assert [r.levelno for r in mine if r.exc_info] == [logging.DEBUG]


def test_an_id_the_ledger_cannot_store_is_refused_whatever_the_decoder(tmp_path: Path) -> None:
    """A decoder that sets a msg_id with a lone surrogate: refused before any lookup."""

    def naive(d: Delivery) -> Outcome:
        d.msg_id = json.loads(d.body)["id"]
        return Outcome(Kind.SUCCESS)

    t = MemoryTransport()
    t.publish(b'{"id": "s\\ud800x"}', ref="bad")
    t.publish(b'{"id": "ok"}', ref="good")
    with Ledger(tmp_path / "l.db") as ledger:
        asyncio.run(Consumer(t, ledger, naive, _ok).run())
    assert [d.ref for d in t.acked] == ["good"]
    assert [(d.ref, r) for d, r in t.dead] == [("bad", "encoding")]


# --- the ledger: one row it cannot store ----------------------------------------------


def entry(msg_id: str, ref: str, **fields: Any) -> Entry:
    d = Delivery(body=b"", ref=ref, msg_id=msg_id, stable_ref=True)
    kept = {"amount": fields.pop("amount")} if "amount" in fields else {}
    f = {"group": "A", "seq": 1, "kept": kept, **fields}
    return Entry(d, Kind.SUCCESS, Settle.ACK, fields=f)


# seq and group go into `messages`; amount (kept) into the presets' `processed` table.
UNSTORABLE = [
    {"seq": 2**64},
    {"amount": -(2**63) - 1},
    {"group": "x\ud800"},
    {"seq": {"a": 1}},
    {"amount": [1]},
    {"kept": {"note": "x\udcff"}},
]


@pytest.mark.parametrize("check", ["checked", "unchecked"])
@pytest.mark.parametrize(
    "bad", UNSTORABLE, ids=[next(iter(b)) + str(i) for i, b in enumerate(UNSTORABLE)]
)
def test_one_unstorable_row_is_refused_alone_and_the_group_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: dict[str, Any], check: str
) -> None:
    """Both paths: the check before the commit, and (check disabled) the entry-by-entry retry."""
    if check == "unchecked":
        monkeypatch.setattr("onceq._ledger.rows.unstorable", lambda value: None)
    group = [entry("m-1", "a.json"), entry("m-2", "b.json", **bad), entry("m-3", "c.json")]
    with Ledger(tmp_path / "l.db", sql=PROCESSED_TABLE) as ledger:
        ledger.commit(group)
        assert [e.kind for e in group] == [Kind.SUCCESS, Kind.REJECTED, Kind.SUCCESS]
        assert group[1].settle is Settle.DEAD and group[1].reason == "ledger-refused"
        assert ledger.processed_ref("m-1") == "a.json" and ledger.processed_ref("m-3") == "c.json"
        assert ledger.processed_ref("m-2") is None
        assert ledger.last_failure("b.json")[0] == "ledger-refused"  # type: ignore[index]


def test_a_database_error_still_fails_the_whole_group(tmp_path: Path) -> None:
    """Only a row's own data is the row's fault: a broken schema stops the run (exit 8)."""
    path = tmp_path / "l.db"
    with Ledger(path) as ledger:
        conn = sqlite3.connect(path)
        conn.execute(
            "CREATE TRIGGER t BEFORE INSERT ON messages BEGIN SELECT * FROM no_such_table; END"
        )
        conn.commit()
        conn.close()
        group = [entry("m-1", "a.json"), entry("m-2", "b.json", seq=2**64)]
        with pytest.raises(LedgerError):
            ledger.commit(group)
        assert ledger.counts() == {"processed": 0, "duplicates": 0, "failures": 0, "replays": 0}


def test_a_file_name_that_is_not_utf8_is_recorded_and_recognised_again(tmp_path: Path) -> None:
    """os.listdir gives such a name as surrogates; it is stored escaped, found the same way."""
    name = "\udcffname.json"
    with Ledger(tmp_path / "l.db") as ledger:
        ledger.commit([entry("m-1", name)])
        assert ledger.processed_ref("m-1") == "\\udcffname.json"
        again = entry("m-1", name)
        again.delivery.redelivered = True
        ledger.commit([again])  # a crash after the commit: this very copy, not a duplicate
        assert again.recovered and ledger.counts()["duplicates"] == 0
        bad = Entry(Delivery(b"", name + "2", stable_ref=True), Kind.REJECTED, Settle.DEAD, "parse")
        ledger.commit([bad])
        assert ledger.last_failure(name + "2") == ("parse", "")


# --- properties: arbitrary bytes and JSON through decode and record ---------------------

huge_ints = st.sampled_from([2**63, -(2**63) - 1, 2**64, 10**30, -(10**40)])
ints = st.integers() | huge_ints
texts = st.text(st.characters(codec=None, exclude_categories=()), max_size=12) | st.sampled_from(
    ["s\ud800x", "\udfff", "a\x00b", "x" * 300, "", "   ", "\n"]
)
floats = st.floats(allow_nan=True, allow_infinity=True)
scalars = st.none() | st.booleans() | ints | floats | texts
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
# Message-shaped objects with hostile values in the fields that are kept.
shaped = st.fixed_dictionaries(
    {},
    optional={
        "msg_id": json_values,
        "guid": json_values,
        "order_no": json_values,
        "claimId": json_values,
        "seq": json_values,
        "amount": json_values,
    },
)


def _dumps(value: Any) -> bytes:
    # ensure_ascii writes a lone surrogate as its escape, and NaN/Infinity as JS does
    return json.dumps(value).encode()


hand_written = st.sampled_from(
    [
        raw(seq=HUGE),
        raw(seq=OVER_64),
        DEEP.encode(),
        b'{"msg_id": "d", "msg_id": "e", "order_no": "A", "seq": 1, "amount": 1}',  # dup keys
        b'{"msg_id": "n", "order_no": "A", "seq": 1, "amount": NaN}',
        b'{"guid": "g", "guid": ' + HUGE.encode() + b"}",
    ]
)
bodies = st.binary(max_size=64) | hand_written | json_values.map(_dumps) | shaped.map(_dumps)
GOOD = [json.dumps({**order(f"good-{i}", seq=i), "guid": f"good-{i}"}).encode() for i in range(3)]


def _check_verdicts(ledger: Ledger, stats: Any, n: int, dead_refs: list[str]) -> None:
    """Every copy has a verdict; each dead one has its failure row with a reason."""
    assert stats.received == n
    assert stats.processed + stats.duplicates + stats.dead == n
    rows = ledger.dead_letters()
    assert sorted(r["ref"] for r in rows) == sorted(dead_refs)
    assert all(r["reason"] for r in rows)
    for i in range(len(GOOD)):
        assert ledger.processed_ref(f"good-{i}") is not None  # the innocent ones commit


def _naive_decode(d: Delivery) -> Outcome:
    """A decoder that checks nothing it keeps: only the ledger stands between it and a crash."""
    doc = json.loads(d.body)
    d.msg_id = str(doc.get("msg_id", d.ref))
    return Outcome(Kind.SUCCESS, fields={k: doc.get(k) for k in ("order_no", "seq", "amount")})


DECODERS = {
    "dirq": lambda d: dirq.decode(d, dirq.MessageSpec()),
    "amqp": amqp.decode,
    "naive": _naive_decode,
}
PROPERTY = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("decoder", sorted(DECODERS))
@pytest.mark.parametrize("handler", [no_effect, _ok], ids=["no_effect", "handler"])
@PROPERTY
@given(hostile=st.lists(bodies, min_size=1, max_size=6))
def test_memory_every_message_gets_a_verdict_and_the_group_commits(
    decoder: str, handler: Any, hostile: list[bytes]
) -> None:
    t = MemoryTransport()
    refs = []
    for i, body in enumerate([GOOD[0], *hostile[:3], GOOD[1], *hostile[3:], GOOD[2]]):
        refs.append(f"r{i}")
        t.publish(body, ref=f"r{i}", msg_id=None)
    with tempfile.TemporaryDirectory() as tmp, Ledger(Path(tmp) / "l.db") as ledger:
        # One group for everything: a bad row must not take the good ones with it.
        consumer = Consumer(t, ledger, DECODERS[decoder], handler, max_group=64)
        stats = asyncio.run(asyncio.wait_for(consumer.run(), 60))
        assert not t.queue and not t.requeued
        assert sorted([d.ref for d in t.acked] + [d.ref for d, _ in t.dead]) == sorted(refs)
        _check_verdicts(ledger, stats, len(refs), [d.ref for d, _ in t.dead])


@PROPERTY
@given(hostile=st.lists(bodies, min_size=1, max_size=5))
def test_dirq_every_file_gets_a_verdict_and_processing_ends_empty(hostile: list[bytes]) -> None:
    files = {f"g{i}.json": body for i, body in enumerate(GOOD)}
    files.update({f"h{i}.json": body for i, body in enumerate(hostile)})
    with tempfile.TemporaryDirectory() as tmp:
        q = DirQueue(Path(tmp) / "q")
        q.init()
        for name, body in files.items():
            write_atomic(q.folder("inbox"), name, body)
        spec = dirq.MessageSpec()
        with Ledger(Path(tmp) / "l.db") as ledger:
            with Worker(q, spec.max_bytes) as w:
                consumer = Consumer(
                    w, ledger, lambda d: dirq.decode(d, spec), max_group=64, max_attempts=1
                )
                stats = asyncio.run(asyncio.wait_for(consumer.run(), 60))
            done = sorted(p.name for p in q.folder("done").iterdir())
            error = sorted(p.name for p in q.folder("error").iterdir())
            assert sorted(done + error) == sorted(files)
            assert list(q.folder("processing").iterdir()) == []
            assert {f"g{i}.json" for i in range(len(GOOD))} <= set(done)
            _check_verdicts(ledger, stats, len(files), error)
