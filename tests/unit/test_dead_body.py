"""A corrected body's checks (onceq._sources.amqp.dead_body), without a broker: the file as
`mq publish` reads it, its id field holding the dead letter's id; and a body shown as
text, its bytes that are not UTF-8 escaped."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from onceq._sources.amqp.dead_body import NewBody, load_body, shown_body
from onceq.errors import BadMessage, NotFound, UsageError


def test_a_body_holding_the_id_is_taken_byte_for_byte(tmp_path: Path) -> None:
    f = tmp_path / "fixed.json"
    raw = b'{"invoice": {"id": "INV-5"}, "total": 5}\n'
    f.write_bytes(raw)
    body = load_body(f, "invoice.id", "INV-5")
    assert body == NewBody(f, raw)
    assert body.as_dict() == {
        "file": str(f),
        "bytes": len(raw),
        "sha256": hashlib.sha256(raw).hexdigest(),
    }


@pytest.mark.parametrize(
    ("text", "error", "why"),
    [
        ('{"invoiceId": "INV-6"}', BadMessage, "invoiceId is 'INV-6', not 'INV-5'"),
        ('{"total": 5}', BadMessage, "no invoiceId"),
        ("[1, 2]", BadMessage, "not a JSON object"),
        ("{", BadMessage, "not JSON"),
        (None, NotFound, "no such file"),
    ],
)
def test_a_body_that_is_not_this_messages_is_refused(
    tmp_path: Path, text: str | None, error: type[Exception], why: str
) -> None:
    f = tmp_path / "fixed.json"
    if text is not None:
        f.write_text(text)
    with pytest.raises(error) as refused:
        load_body(f, "invoiceId", "INV-5")
    assert str(refused.value).startswith(f"{f}: ") and why in str(refused.value)


def test_a_flow_without_an_id_field_cannot_check_a_body(tmp_path: Path) -> None:
    f = tmp_path / "fixed.json"
    f.write_text('{"total": 5}')
    with pytest.raises(UsageError, match="message_id property alone"):
        load_body(f, None, "INV-5")


def test_a_body_is_shown_as_its_text_or_with_its_bad_bytes_escaped() -> None:
    assert shown_body('{"name": "Zoë"}'.encode()) == ('{"name": "Zoë"}', True)
    assert shown_body(b'{"a": "\xff"}') == ('{"a": "\\xff"}', False)
