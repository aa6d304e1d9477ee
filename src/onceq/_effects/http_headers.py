"""The headers an HTTP effect sends, checked before any message is consumed.

Both ways of giving headers end here: `--header 'NAME: VALUE'` (`parse_header_arg`,
from onceq._cli.flow_options) and a flow file's `headers` table (onceq._flows.file_effects),
each then through `request_headers`, which HttpEffect's constructor calls. So a
mistake reads the same whichever way it was made, and is refused (exit 2) before a
queue, a broker or a ledger is opened — not found by aiohttp on every message, where
its ValueError was a traceback per message retried as transient for 13 minutes.

What aiohttp refuses, or sends wrong, and is refused here instead:

| mistake                                          | aiohttp                                 |
| a URL with user:password@ and an Authorization   | ValueError "Cannot combine AUTHORIZATION |
|   header (or idempotency header)                 |   header with … credentials in URL"      |
| a name that is not an RFC 9110 token             | sent as it is: a partner's 400           |
| a control character in a value (CR/LF: injection) | ValueError "Forbidden control character" |
| a lone surrogate (an undecodable ${ENV} byte)    | dropped, or UnicodeEncodeError           |
| Content-Length / Transfer-Encoding               | sent beside (or instead of) its own: a   |
|                                                  |   body cut or a request that hangs       |
| one name twice (names ignore case)               | both sent                               |

A header's value is a secret whatever its shape, and so is a mistyped `--header`
argument: a refusal shows only the name-ish prefix (words of letters joined by '-';
the rest is `***`), and whatever follows it is remembered (onceq._core.redact) so that nothing
else prints it either. An argument of no recognisable shape is shown as `***` whole.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from onceq._core.redact import MASK, remember_secret
from onceq._core.url_check import shown as shown_url
from onceq._core.values import CONTROL_CHARS
from onceq.errors import UsageError

TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 field-name
# What a refusal may show of something that may not be a header name: words of letters
# joined by '-' (X-Api-Key, Authorization), at most 40 characters. It stops at a digit,
# '_', '.', '=', '/', '+' (a token's characters, and an API key's, a base64 or JWT
# secret's too): in `ab12cd=…` nothing tells a name from a secret, so none is shown.
_SHOWN = re.compile(r"(?=[A-Za-z-]{1,40}(?![A-Za-z0-9_-]))[A-Za-z]+(?:-[A-Za-z]+)*")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
# aiohttp sets them from each message's body; a fixed one would be wrong for all.
COMPUTED = frozenset({"content-length", "transfer-encoding"})
SHAPE = "not 'NAME: VALUE'"


def parse_header_arg(text: str) -> tuple[str, str]:
    """`--header 'NAME: VALUE'` as (NAME, VALUE stripped), or a masked UsageError.

    The error names the option and the reason and shows only the name-ish prefix:
    `--header X-Api-Key=***: not 'NAME: VALUE' ('=' instead of ':')`.
    """
    name, colon, value = text.partition(":")
    if colon and TOKEN.fullmatch(name.strip()):
        return name.strip(), value.strip()
    body = text.strip()
    head = m.group(0) if (m := _SHOWN.match(body)) else ""
    rest = body[len(head) :]
    after = rest[1:].strip()
    if colon and not name.strip():
        shown, why, secret = f": {MASK}", "no name before the ':'", value
    elif head and rest[:1] == "=" and after:
        shown, why, secret = f"{head}={MASK}", "'=' instead of ':'", after
    elif head and rest[:1].isspace() and after and not colon:
        shown, why, secret = f"{head} {MASK}", "no ':' after the name", after
    elif colon and head:
        shown, why, secret = f"{head}{MASK}", "the text before ':' is not a header name", rest
    else:  # no shape to go by: all of it may be the secret
        shown, why, secret = MASK, "no ':' in it", text
    _remember(secret)
    raise UsageError(f"header {shown}: {SHAPE} ({why})")


def shown_name(name: str) -> str:
    """A header name as a refusal may show it: whole when it is one, else its name-ish
    prefix and `***` (the rest remembered as a secret: it may be a mistyped value)."""
    if TOKEN.fullmatch(name):
        return name
    head = m.group(0) if (m := _SHOWN.match(name)) else ""
    _remember(name[len(head) :])
    return f"{head}{MASK}"


def request_headers(
    url: str, headers: Mapping[str, str] | None, idempotency_header: str | None
) -> dict[str, str]:
    """The headers sent with every request (Content-Type first), or a UsageError naming
    the header (`header NAME: …`, `idempotency header NAME: …`) or the URL (`url …`)."""
    base: dict[str, str] = {"Content-Type": "application/json"}
    seen: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if not isinstance(name, str) or not TOKEN.fullmatch(name):
            raise UsageError(f"header {shown_name(str(name))}: not a header name")
        # The value is a secret: never shown, not even in these refusals. CR/LF are
        # header injection (aiohttp refuses them); a TAB or another control character
        # is no part of a credential either: one rule, every control character.
        if not isinstance(value, str) or CONTROL_CHARS.search(value):
            raise UsageError(f"header {name}: its value is not one line of text")
        if _SURROGATE.search(value):
            raise UsageError(f"header {name}: its value holds a byte that is not UTF-8")
        _no_clash(name, seen, "header")
        seen[name.lower()] = name
        if name.lower() == "content-type":
            del base["Content-Type"]  # the user's, not ours beside it: one is sent
        base[name] = value
    if idempotency_header is not None:
        if not isinstance(idempotency_header, str) or not TOKEN.fullmatch(idempotency_header):
            shown = shown_name(str(idempotency_header))
            raise UsageError(f"idempotency header {shown}: not a header name")
        _no_clash(idempotency_header, seen, "idempotency header")
        seen[idempotency_header.lower()] = idempotency_header
    if "authorization" in seen and _has_userinfo(url):
        raise UsageError(
            # No '@' in these words: the masking reads a URL's userinfo up to the last one.
            f"url {shown_url(url)}: credentials in the URL and an Authorization header"
            f" ({seen['authorization']}) cannot be combined: both are the login, keep one"
        )
    return base


def _no_clash(name: str, seen: Mapping[str, str], role: str) -> None:
    low = name.lower()
    if low in COMPUTED:
        raise UsageError(f"{role} {name}: the HTTP client sets it from each message's body")
    if low not in seen:
        return
    if role == "header":
        raise UsageError(f"header {name}: {seen[low]} is given already (names ignore case)")
    # The message's id would replace the header's value (or be sent beside it).
    raise UsageError(f"{role} {name}: a header of that name is given too; keep one")


def _has_userinfo(url: str) -> bool:
    """What aiohttp takes as credentials (helpers.strip_auth_from_url): a user or a
    password, even an empty one (`http://:pw@h`, `http://bob@h`)."""
    from yarl import URL

    try:
        parsed = URL(url)
    except (ValueError, TypeError):
        return "@" in url.split("?", 1)[0].split("#", 1)[0]
    return parsed.raw_user is not None or parsed.raw_password is not None


def _remember(secret: str) -> None:
    for text in (secret, secret.strip(" \t=:")):
        if text:
            remember_secret(text)
