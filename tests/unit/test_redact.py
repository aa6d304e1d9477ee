"""The masking rule: userinfo's password masked whatever the scheme, in values, texts,
log lines and the CLI's streams."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceq import errors
from onceq._core import redact
from onceq._core.logs import RedactingFormatter
from onceq._core.redact import RedactingStream, guarded_stdio, redact_text, redact_url, remember


@pytest.fixture(autouse=True)
def nothing_remembered() -> Iterator[None]:
    """Each test starts without remembered passwords: the patterns alone are tested,
    unless a test calls `remember` itself."""
    redact.forget_all()
    yield
    redact.forget_all()


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("amqp//alice:s3cr3t@127.0.0.1:5672/", "amqp//alice:***@127.0.0.1:5672/"),
        ("amqp:/alice:s3cr3t@127.0.0.1:5672/", "amqp:/alice:***@127.0.0.1:5672/"),
        ("amqps//alice:s3cr3t@h/", "amqps//alice:***@h/"),
        ("http//bob:pw@127.0.0.1:9202", "http//bob:***@127.0.0.1:9202"),
        ("a:b@h", "a:***@h"),
        ("//a:b@h", "//a:***@h"),
        ("amqp://a:b:c@h", "amqp://a:***@h"),
        ("a:b:c@h", "a:***@h"),  # `a` may be the user: mask from its ':'
        ("amqp:alice:pw@h", "amqp:***@h"),  # the same: masks more, never less
        ("amqp://u:p@ss@h/v", "amqp://u:***@h/v"),
        ("amqp://u:p/ss@h/", "amqp://u:***@h/"),
        ("amqp://u:12#ss@h/", "amqp://u:***@h/"),  # parses as host u, port 12
        ("amqp://u:p?ss@h/", "amqp://u:***@h/"),
        ("amqp://u:p w@h/%2F", "amqp://u:***@h/%2F"),
        ("amqp:/a:p//w@h", "amqp:/a:***@h"),
        ("amqp://u:pé€🙂@h/", "amqp://u:***@h/"),
        (
            "amqp://svc:p%40ss:w0rd@broker.example:5671/prod",
            "amqp://svc:***@broker.example:5671/prod",
        ),
        ("amqp://guest:guest@127.0.0.1:5672/%2F", "amqp://guest:***@127.0.0.1:5672/%2F"),
    ],
)
def test_redact_url_masks_every_shape_of_userinfo(url: str, masked: str) -> None:
    assert redact_url(url) == masked
    # The same URL inside a message, as the free-text masking sees it.
    assert redact_text(f"onceq: EAI_AMQP_URL={url}: not an amqp:// URL") == (
        f"onceq: EAI_AMQP_URL={masked}: not an amqp:// URL"
    )


@pytest.mark.parametrize(
    "url",
    ["amqp://127.0.0.1/%2F", "amqp://alice@h/", "http://127.0.0.1:9202", "127.0.0.1:9202"],
)
def test_a_url_without_password_is_left_alone(url: str) -> None:
    assert redact_url(url) == url
    assert redact_text(f"x {url}: y") == f"x {url}: y"


@pytest.mark.parametrize(
    "text",
    [
        "onceq: q/inbox/a@b.json: parse",
        "time 12:30:00 user@example.com",
        "onceq: new ledger at q/ledger.db: no message seen before",
    ],
)
def test_text_that_is_not_a_url_is_left_alone(text: str) -> None:
    assert redact_text(text) == text


def test_errors_still_exports_the_masking() -> None:
    assert errors.redact_url is redact_url and errors.redact_text is redact_text


SCHEMES = st.sampled_from(["amqp://", "amqp//", "amqp:/", "amqps//", "http//", "//", "x+y.z:///"])
# Anything but a line break (a log line ends there) and surrogates (not text).
PASSWORD = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\n\r"), min_size=1
).map(lambda s: "Qz" + s + "9K")


@settings(max_examples=300, deadline=None)
@given(scheme=SCHEMES, user=st.from_regex(r"[a-z0-9._-]{0,8}", fullmatch=True), pw=PASSWORD)
def test_no_password_survives_either_masker(scheme: str, user: str, pw: str) -> None:
    url = f"{scheme}{user}:{pw}@127.0.0.1:5672/v"
    assert pw not in redact_url(url)
    assert pw not in redact_text(f"onceq: cannot use {url} (refused); retry")


@settings(max_examples=200, deadline=None)
@given(user=st.from_regex(r"[a-z]{1,8}", fullmatch=True), pw=PASSWORD)
def test_a_remembered_password_is_masked_in_any_shape(user: str, pw: str) -> None:
    """A library may quote the password alone, percent-encoded or escaped."""
    import json
    from urllib.parse import quote

    remember(f"amqp://{user}:{pw}@h/")
    for shape in (pw, quote(pw, safe=""), json.dumps(pw)[1:-1], repr(pw)[1:-1]):
        assert pw not in redact_text(f"ValueError: invalid value {shape!s} in URL")


def test_a_remembered_piece_of_a_password_quoted_by_urlsplit_is_masked() -> None:
    url = "amqp://alice:s3cr3tt/x@127.0.0.1/"
    remember(url)
    out = redact_text("Port could not be cast to integer value as 's3cr3tt/x'")
    assert "s3cr3tt" not in out


def test_a_password_equal_to_its_user_is_not_remembered() -> None:
    """guest:guest: replacing every 'guest' would turn guest:***@ into ***:***@."""
    remember("amqp://guest:guest@127.0.0.1:5672/%2F")
    assert redact_text("amqp://guest:guest@h/") == "amqp://guest:***@h/"


def test_log_lines_are_masked_whoever_logs_them() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(RedactingFormatter("%(name)s: %(message)s"))
    log = logging.getLogger("aiormq.test-redact")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.error("connect to %s failed", "amqp//alice:s3cr3tLOG@127.0.0.1/")
    finally:
        log.removeHandler(handler)
    assert "s3cr3tLOG" not in stream.getvalue()
    assert "amqp//alice:***@127.0.0.1/" in stream.getvalue()


def test_the_stream_masks_a_url_written_in_pieces() -> None:
    out = io.StringIO()
    stream = RedactingStream(out)  # type: ignore[arg-type]
    stream.write('{"url": "amqp//alice:s3cr')
    stream.write('3tPIECE@h/"}\n')
    stream.write("progress amqp:/u:pwPARTIAL@h")  # no newline: passed on at flush
    stream.flush()
    assert "s3cr3tPIECE" not in out.getvalue() and "pwPARTIAL" not in out.getvalue()
    assert out.getvalue() == '{"url": "amqp//alice:***@h/"}\nprogress amqp:/u:***@h'


def test_the_stream_is_text_only_and_hides_its_buffer() -> None:
    """click writes bytes to a stream's .buffer when it has one: past the masking."""
    stream = RedactingStream(io.StringIO())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        stream.write(b"")  # type: ignore[arg-type]
    assert not hasattr(stream, "buffer")


def test_a_traceback_inside_the_guard_is_masked_and_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    remember("amqp//alice:s3cr3tOUT@h")  # a URL the run was given
    try:
        with pytest.raises(SystemExit) as exc, guarded_stdio():
            print("stdout amqp//alice:s3cr3tOUT@h, data sip:bob:x@example.com")
            raise ValueError("bad URL amqp//alice:s3cr3tTB@h")
    finally:
        redact.forget_all()
    assert exc.value.code == 1
    out, err = capsys.readouterr()
    assert "s3cr3tOUT" not in out and "alice:***@h" in out
    # stdout is data: no pattern there (a msg_id that looks like userinfo stays whole).
    assert "sip:bob:x@example.com" in out
    assert "s3cr3tTB" not in err and "Traceback" in err and "ValueError" in err
    assert not isinstance(sys.stdout, RedactingStream)  # put back


def test_a_user_read_as_a_scheme_before_a_slashed_password_is_masked() -> None:
    """`oh35:/@pw@h` (no scheme typed, a password starting with '/'): the colon after
    one slash may be the userinfo's, so the rest up to the last '@' is masked; after
    `://` it is the scheme's (`amqp://alice@h` has no password)."""
    from onceq._core.redact import redact_text, redact_url

    assert redact_url("oh35:/@ab000AAA@@127.0.0.1") == "oh35:***@127.0.0.1"
    assert redact_text("x oh35:/@ab000AAA@@127.0.0.1") == "x oh35:***@127.0.0.1"
    assert redact_url("amqp://alice@h") == "amqp://alice@h"
