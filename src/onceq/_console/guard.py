"""What keeps the console safe by default: where it listens, who may read, who may change.

- **Where.** 127.0.0.1 unless told otherwise. Any other address needs a token (from a
  file or ONCEQ_CONSOLE_TOKEN): without one the console refuses to start (`check_bind`).
- **Who reads.** With a token, every /api/ request carries it (`Authorization: Bearer`;
  the page keeps it from `?token=` in the tab's sessionStorage), compared in constant
  time. Without one (loopback only), the Host header must name this machine, so a web
  page on another origin cannot reach the API through DNS rebinding.
- **Who changes.** A POST needs, besides the token, the CSRF token the page got from
  /api/session (a same-origin read: another site's page cannot read it) in
  X-CSRF-Token, and no Origin but our own. Anything else: 403, nothing changed.
- **What a page may run.** A Content-Security-Policy of 'self' only: no inline script,
  no script from elsewhere; the page writes every value with textContent, so a message
  body or an id is text, never HTML. No frame may hold the page.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from onceq.errors import UsageError

TOKEN_ENV = "ONCEQ_CONSOLE_TOKEN"
CSRF_HEADER = "X-CSRF-Token"
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none';"
    " base-uri 'none'; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(host: str) -> bool:
    if host in LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_token(token_file: Path | None) -> str | None:
    """The token from --token-file (its first line), else ONCEQ_CONSOLE_TOKEN, else None."""
    if token_file is not None:
        try:
            lines = token_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(
                f"--token-file: {token_file}: cannot read it ({exc.__class__.__name__})"
            ) from None
        token = lines[0].strip() if lines else ""
        if not token:
            raise UsageError(
                f"--token-file: {token_file}: empty; write the token on its first line"
            )
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if token and len(token) < 16:
        raise UsageError("the console token is shorter than 16 characters: too easy to guess")
    return token or None


def check_bind(host: str, token: str | None) -> None:
    """Refuse a non-loopback address without a token (exit 2, nothing started)."""
    if not is_loopback(host) and token is None:
        raise UsageError(
            f"--host {host}: the console listens beyond this machine only with a token"
            f" (--token-file FILE or {TOKEN_ENV}); nothing started"
        )


class Guard:
    """The middleware: security headers on every answer, the checks above on /api/."""

    def __init__(self, token: str | None) -> None:
        self.token = token
        self.csrf = secrets.token_urlsafe(32)  # new at every start: a page reloads it

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = self.refusal(request)
        if refused is not None:
            response: web.StreamResponse = web.json_response({"error": refused}, status=403)
        else:
            try:
                response = await handler(request)
            except web.HTTPException as exc:  # no such route, method …: JSON, headers too
                response = web.json_response({"error": exc.reason}, status=exc.status)
                if "Allow" in exc.headers:  # a 405 says which methods there are
                    response.headers["Allow"] = exc.headers["Allow"]
        response.headers.update(HEADERS)
        return response

    def refusal(self, request: web.Request) -> str | None:
        """Why this request is refused, or None."""
        if self.token is None and not _local_host(request.host):
            return "this console answers only to localhost and 127.0.0.1"
        if not request.path.startswith("/api/") or request.path == "/api/openapi.json":
            return None  # the page and its assets hold nothing
        if self.token is not None and not _same(_bearer(request), self.token):
            return "a valid token is needed (Authorization: Bearer TOKEN)"
        unrouted = request.match_info.http_exception is not None  # answered 404/405 anyway
        if request.method not in ("GET", "HEAD", "OPTIONS") and not unrouted:
            origin = request.headers.get("Origin")
            if origin is not None and origin != f"{request.scheme}://{request.host}":
                return "a change from another origin is refused"
            if not _same(request.headers.get(CSRF_HEADER, ""), self.csrf):
                return f"a change needs the page's {CSRF_HEADER}"
        return None


def _local_host(host: str) -> bool:
    """A Host header naming this machine: its name without the port is a loopback."""
    return is_loopback(host.rsplit(":", 1)[0] if not host.endswith("]") else host)


def _bearer(request: web.Request) -> str:
    value = request.headers.get("Authorization", "")
    return value[7:].strip() if value[:7].lower() == "bearer " else ""


def _same(given: str, expected: str) -> bool:
    # Constant time: how long a comparison takes must not say how much of it matched.
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode("utf-8"))
