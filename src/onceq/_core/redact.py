"""Secrets never reach output: URL passwords masked in every value, text and stream.

One rule: whatever looks like userinfo (`user:password@host`) in a URL-ish value has
its password replaced by `***`, whatever the scheme or its absence (`amqp//a:b@h`,
`amqp:/a:b@h`, `//a:b@h`, `a:b@h`), and a password runs to the LAST `@` (a password
may hold `@`, `/`, `#`, `?`, spaces). Where a text is ambiguous, more is masked, never
less: a leaked password costs more than a hard-to-read line.

Three layers, each a fallback for the one before:

- `redact_url(value)`: a value known to be a URL (the broker URL, --claim, a ledger
  path). A well-formed URL is masked as parsed (yarl's `with_password`, as aio-pika
  does); the pattern rule below then runs over the result, since a mistyped URL parses
  "fine" into the wrong parts (`amqp://u:12#pw@h` has host u, port 12, no password).
- `redact_text(text)`: free text (messages, log lines, third-party exception texts).
  Patterns find userinfo after a URL-ish head; and every password of a URL the user
  gave us (`remember`) is replaced wherever it appears, in the shapes libraries echo
  it (raw, percent-encoded or decoded, JSON- or repr-escaped), since an exception text
  can quote a password in a shape no URL pattern sees ("port ... as 's3'").
- `RedactingStream`: the CLI's stdout and stderr (`guarded_stdio`), so that whatever
  reaches them (rich, click, logging, warnings, a traceback) is masked. stderr (errors,
  logs, tracebacks) gets the whole `redact_text`; stdout only the remembered passwords
  (`redact_secrets`): stdout carries data — a msg_id `sip:alice@example.com`, a --help
  example with the default `guest:guest@` — and a pattern would rewrite it, so a script
  reading `--json` would get ids that are not in the ledger. What onceq itself puts on
  stdout from a URL is masked where it is formatted (`redact_url`).
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from typing import Any, TextIO
from urllib.parse import quote, unquote, urlsplit

MASK = "***"
# A remembered password shorter than this is not replaced in free text: replacing every
# "ab" in the output would garble it. Short passwords are still masked by the patterns.
MIN_REMEMBERED = 4

# A scheme-ish word followed by at least one slash, or a bare `//`: a URL's authority
# starts here, so `user:` then anything up to the last `@` on the line is userinfo.
# The user part may hold `@` (an unencoded e-mail address as user name).
_AFTER_SCHEME = r"(?:[A-Za-z][A-Za-z0-9+.\-]*:/+|//)[^\s:/]*:"
# Bare userinfo at the start of a token (`a:b@h`, `EAI_AMQP_URL=a:b@h`, `'a:b@h'`):
# without a URL-ish head a space ends it, else every "word: text@x" would be masked.
_BARE = r"(?:^|(?<=[\s'\"=(<\[,/]))[^\s:/'\"=]+:"
# `(?!//)`: `amqp://alice@h` has a scheme, not a password, before its `@`; after a
# single slash (`oh35:/@pw@h`) the colon may be the userinfo's, so it is masked.
_USERINFO = re.compile(rf"(?P<a>{_AFTER_SCHEME})[^\n]*@|(?P<b>{_BARE})(?!//)\S*@", re.MULTILINE)

_remembered: set[str] = set()


def redact_url(url: str) -> str:
    """`url` (a value known to be a URL) with any password replaced by `***`."""
    return _mask_value(_mask_parsed(url))


def redact_text(text: str) -> str:
    """`text` with every URL password in it masked (patterns, then remembered secrets)."""
    if "@" in text:
        text = _USERINFO.sub(lambda m: (m.group("a") or m.group("b")) + MASK + "@", text)
    # Longest first: a secret that contains another is replaced whole.
    return redact_secrets(text)


def redact_secrets(text: str) -> str:
    """`text` with every remembered password replaced (no pattern: data stays as it is)."""
    for secret in sorted(_remembered, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def remember(url: str) -> None:
    """Mask the password(s) of `url`, a value the user gave, in all later free text.

    Called where a URL enters (the broker URL, --claim). Every reading of where the
    password is (parsed, by pattern) is kept: a mistyped URL is read differently by
    each library that echoes it.
    """
    for user, secret in _passwords(url):
        # A password equal to its user name is printed anyway as the user name (which
        # is kept): replacing it would only garble `guest:***@` into `***:***@`.
        if secret == user or len(secret) < MIN_REMEMBERED:
            continue
        remember_secret(secret)


def remember_secret(secret: str) -> None:
    """Mask `secret` (a header value: a bearer token, an API key) in all later output.

    The CLI calls it for every header value it is given (flags, flow files, `${ENV}`),
    before anything can echo it: a partner that quotes the header in its error body,
    a library's exception, a traceback. Shapes shorter than MIN_REMEMBERED are left
    to the HTTP effect's own masking of its details.
    """
    _remembered.update(s for s in secret_shapes(secret) if len(s) >= MIN_REMEMBERED)


def secret_shapes(secret: str) -> set[str]:
    """`secret` in every shape a library or a partner may echo it in.

    Raw, percent-encoded or decoded, JSON- or repr-escaped, with its runs of blanks
    made one (a detail is put on one line); and for an auth header (`Bearer T`,
    `Basic T`) the credential T alone, which is what a partner's "invalid token T"
    quotes.
    """
    import json  # here, not at the top: `onceq dirq lag` must start fast

    bases = {secret, " ".join(secret.split())}
    scheme, blank, credential = secret.strip().partition(" ")
    if blank and scheme.isalpha() and credential.strip():
        bases.add(credential.strip())
    shapes: set[str] = set()
    for s in bases:
        shapes.update(
            (
                s,
                unquote(s),
                quote(s, safe=""),
                quote(s, safe="!$&'()*+,;=:"),  # userinfo as a URL library writes it
                json.dumps(s)[1:-1],
                json.dumps(s, ensure_ascii=False)[1:-1],
                repr(s)[1:-1],
            )
        )
    shapes.discard("")
    return shapes


def forget_all() -> None:
    """Drop every remembered password (tests; a long-lived process that is done)."""
    _remembered.clear()


def _passwords(url: str) -> Iterator[tuple[str, str]]:
    """(user, password) for every reading of `url` that finds a password."""
    span = _userinfo_span(url)
    if span is not None:
        start, colon, at = span
        yield url[start:colon], url[colon + 1 : at]
    with contextlib.suppress(ValueError):
        parts = urlsplit(url)
        if parts.password:
            yield parts.username or "", parts.password
    parsed = _yarl(url)
    if parsed is not None and parsed.raw_password:
        yield parsed.raw_user or "", parsed.raw_password
        yield parsed.user or "", parsed.password or ""


def userinfo_password(value: str) -> str | None:
    """The password as the masking rule reads it (first ':' to the last '@'), or None."""
    span = _userinfo_span(value)
    return None if span is None else value[span[1] + 1 : span[2]]


def _yarl(url: str) -> Any:
    try:
        from yarl import URL

        return URL(url)
    except (ValueError, TypeError):  # yarl refuses what it cannot parse
        return None


def _mask_parsed(url: str) -> str:
    """A well-formed `scheme://user:pw@host…` with pw masked as yarl renders it."""
    if "://" not in url:
        return url
    parsed = _yarl(url)
    if parsed is None or parsed.password is None or not parsed.host:
        return url
    try:
        return str(parsed.with_password(MASK))
    except (ValueError, TypeError):
        return url


def _mask_value(value: str) -> str:
    """The pattern rule on a whole value: from the userinfo's first ':' to the last '@'."""
    span = _userinfo_span(value)
    if span is None:
        return value
    _start, colon, at = span
    return value[: colon + 1] + MASK + value[at:]


def _userinfo_span(value: str) -> tuple[int, int, int] | None:
    """(start, first ':', last '@') of the userinfo in `value`, or None when it has none.

    The authority starts after the first `//`; else after a `scheme:/`; else at the
    start. The first of these whose text up to the last '@' holds a ':' is taken, so
    `amqp:/a:p//w@h` (a '//' inside the password) still masks from `a:`. A ':' that is
    the scheme's own (`amqp://alice@h`: no password) is never taken as the userinfo's.
    """
    at = value.rfind("@")
    if at < 0:
        return None
    head = value[:at]
    starts = []
    slashes = head.find("//")
    if slashes >= 0:
        starts.append(len(head) - len(head[slashes:].lstrip("/")))
    # Only with a slash: in `a:b:c@h` the `a:` may be a user as well as a scheme.
    scheme = re.match(r"[A-Za-z][A-Za-z0-9+.\-]*:/+", head)
    if scheme:
        starts.append(scheme.end())
    starts.append(0)
    for start in starts:
        colon = head.find(":", start)
        if colon < 0:
            continue
        if head[colon + 1 : colon + 3] == "//" and start == 0 and scheme is not None:
            continue  # the scheme's colon of `amqp://…`: not a password's
        # With one slash (`oh35:/@pw@h`: the user typed as a scheme, a password that
        # starts with '/'), the colon may be the userinfo's: masked, more rather than less.
        return start, colon, at
    return None


class RedactingStream:
    """A text stream that passes every complete line through `redact_text`.

    Whole lines, not single writes: a URL written in two pieces (json.dump writes
    token by token) is masked once it is whole. `flush` passes on a partial line (a
    progress display redraws without a newline). No `buffer` attribute: click would
    otherwise write bytes past the wrapper.
    """

    def __init__(self, stream: TextIO, mask: Any = None) -> None:
        self._stream = stream
        self._pending = ""
        self._mask = mask or redact_text

    def write(self, s: str) -> int:
        if not isinstance(s, str):  # click probes with b"" to tell binary from text
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        self._pending += s
        if "\n" in self._pending:
            done, _, self._pending = self._pending.rpartition("\n")
            self._stream.write(self._mask(done + "\n"))
        return len(s)

    def flush(self) -> None:
        if self._pending:
            self._stream.write(self._mask(self._pending))
            self._pending = ""
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        if name == "buffer":
            raise AttributeError(name)
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_stdio() -> Iterator[None]:
    """Redact sys.stdout and sys.stderr inside the block (the CLI's last line of defence).

    An unexpected exception (a bug) is printed here, through the redacting stderr, and
    exits 1 as Python would: left to Python, its traceback would be printed after the
    streams are restored, and an exception text may quote a URL.
    """
    out, err = sys.stdout, sys.stderr
    # stdout is data (see the module's docstring): remembered passwords only.
    sys.stdout, sys.stderr = RedactingStream(out, redact_secrets), RedactingStream(err)
    try:
        yield
    except Exception:
        import traceback

        traceback.print_exc()
        raise SystemExit(1) from None
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr = out, err
