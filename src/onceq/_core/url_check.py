"""A URL a user gave (a broker's, a partner's): checked before use, shown masked.

Checked here, once for every kind of URL, not left to the libraries that open it:
they raise a bare ValueError deep in a connect, whose words may quote pieces of the
password. `shown` is how a refusal may print a URL it could not parse.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from onceq._core.redact import redact_url, remember
from onceq.errors import UsageError

__all__ = ["check_url", "shown"]


def check_url(url: str, label: str, schemes: tuple[str, ...], port_role: str) -> str:
    """url, or UsageError naming `label` (the password masked) when it cannot be used.

    Checked here, not left to aiormq/yarl/aiohttp: they raise a bare ValueError deep
    in connect, which would surface as a traceback instead of one line. A port of 0
    is refused up front: every connection would fail (for a claim system, that would
    dead-letter the whole queue).
    """
    # Before anything can echo it: from here on the password is masked in any text,
    # in whatever shape a library quotes it.
    remember(url)
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port that is not a number in 0-65535
    except ValueError as exc:
        raise UsageError(f"{label}{shown(url)}: not a valid URL ({_why(exc)})") from None
    if parts.scheme not in schemes or not parts.hostname:
        wanted = " or ".join(f"{s}://" for s in schemes)
        raise UsageError(f"{label}{shown(url)}: not an {wanted} URL")
    if port == 0:
        raise UsageError(f"{label}{shown(url)}: port 0 is not {port_role}")
    _check_with_yarl(url, label)
    return url


def _check_with_yarl(url: str, label: str) -> None:
    """Refuse what urlsplit accepts but yarl (aiormq's and aiohttp's parser) does not.

    yarl is stricter: a backslash before the host (`amqp://a:pw\\@h`, a password typed
    with one) raises a bare ValueError inside `aiormq.connect`, which escaped every
    boundary as a traceback. Its words are not shown as they are: one of them quotes
    the netloc, password and all.
    """
    import yarl  # why: aiohttp's parser; loaded only when a URL is checked (start-up)

    try:
        yarl.URL(url)
    except ValueError as exc:
        raise UsageError(f"{label}{shown(url)}: not a valid URL ({_why(exc)})") from None


_SCHEME_HEAD = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:/+")
_A_PORT = re.compile(r"\d*(?:[/?#]|$)")


def shown(url: str) -> str:
    """A refused URL as a refusal may show it: masked, and with no '@' cut at its ':'.

    Without an '@' nothing tells a password from a host or a port: `amqp://alice:s3cr3t`
    (the '@' and host forgotten) parses as host alice, port s3cr3t, and no pattern
    sees a password. So after the authority's first ':' only a port (digits) is shown.
    """
    if "@" in url:
        return redact_url(url)
    # After a `scheme:/…` head, else from the start: in `amqp//alice:pw` (a typo) the
    # first ':' is still the userinfo's; in `amqp:alice:pw` masking from `amqp:` is more
    # than needed, never less.
    head = _SCHEME_HEAD.match(url)
    start = head.end() if head else 0
    colon = url.find(":", start)
    if colon < 0 or _A_PORT.match(url, colon + 1):
        return url
    return url[: colon + 1] + "***"


def _why(exc: ValueError) -> str:
    """The parser's reason (urlsplit's or yarl's) in our words, never in theirs.

    Their texts quote the URL's pieces: "Port could not be cast to integer value as
    's3'" quotes what stood where the port should be, "'ab1' does not appear to be an
    IPv4 or IPv6 address" what stood in brackets, yarl's "netloc '…' contains invalid
    characters" the whole userinfo — in a mistyped URL, pieces of the password.
    """
    text = str(exc)
    if text in ("Port out of range 0-65535", "Invalid IPv6 URL"):
        return text  # quotes nothing: the parser's own words, as a reader may search them
    if "backslash" in text:
        return "a backslash before the host: write it %5C in a password"
    if "port" in text.lower():
        return "the port is not a number"
    if "IPv" in text or "bracket" in text:
        return "brackets that do not hold an IPv6 address"
    return "its host or user part has characters a URL cannot hold"
