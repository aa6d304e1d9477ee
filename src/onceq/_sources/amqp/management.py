"""The RabbitMQ management HTTP API, read for what AMQP cannot tell: unacked, memory.

A passive queue declare (onceq._sources.amqp.depths) gives a queue's ready messages and its
consumers, live, over the AMQP connection every command has anyway. It does not give
the messages delivered and not yet acked, nor the node's memory alarm: only the
management plugin's HTTP API knows those, and only where the plugin is enabled. So
the API is optional: when it is off, unreachable, or refuses the login, the figures it
would give are None ("-" in a table) and everything else still works. A read never
fails because of it, and it warns once per outage (not once per read: a cache
refreshing every 5 s would fill a log).

Where the API is: `--management-url` / EAI_RABBITMQ_API (a URL, or "off"), else the
AMQP host on port 15672 (http) — or 15671 (https) for an amqps:// broker, so that a
user who chose TLS for AMQP never has the password sent in clear over HTTP. The
login is the override URL's own user:password when it carries one, else the AMQP
URL's (guest/guest when it has none, as aiormq does). URLs are parsed by yarl, never
by hand; the password is sent only in the Authorization header, and the URL this
module shows has it masked.

Its figures lag: the broker publishes queue statistics every
collect_statistics_interval (5 s by default), so `unacked` may be that old, and a
queue declared a moment ago has none yet (None until the first emission).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from onceq._core.redact import redact_text, redact_url, remember_secret
from onceq._core.url_check import check_url

log = logging.getLogger("onceq.amqp.management")  # the name in every log line: kept across moves

ENV_API = "EAI_RABBITMQ_API"
OFF = ("off", "")
HTTP_PORT = 15672
HTTPS_PORT = 15671
# Seconds for one request, connect included: a firewall that drops packets must not
# hold `mq status` (or a cache refresh) for long; the figures are a nicety.
TIMEOUT = 2.0
QUEUE_COLUMNS = "name,messages_ready,messages_unacknowledged,consumers"
NODE_COLUMNS = "name,running,mem_limit,mem_used,mem_alarm,disk_free_alarm"


class ManagementApi:
    """One management API endpoint: where it is, how to log in, and how it last answered.

    `available` is None before the first request, then whether the last one was
    answered; `error` is why it was not (redacted, one line). Build it with
    `management_api`.
    """

    def __init__(self, base: Any, login: str, password: str, shown: str) -> None:
        self.base = base  # yarl.URL of the API's root, without userinfo
        self.url = shown  # the URL as any output may show it (password masked)
        self._authorization = "Basic " + base64.b64encode(f"{login}:{password}".encode()).decode(
            "ascii"
        )
        # The header value is a secret like the password: masked in any later text.
        remember_secret(self._authorization)
        self.available: bool | None = None
        self.error: str | None = None

    def __repr__(self) -> str:  # never the header
        return f"ManagementApi({self.url!r})"

    def session(self) -> Any:
        """An aiohttp session for this API (the caller closes it; a cache keeps one)."""
        import aiohttp

        return aiohttp.ClientSession(
            headers={"Authorization": self._authorization},
            timeout=aiohttp.ClientTimeout(total=TIMEOUT),
        )

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "available": bool(self.available), "error": self.error}

    async def queues(
        self, session: Any, vhost: str, names: Sequence[str]
    ) -> dict[str, dict[str, Any] | None] | None:
        """{name: the queue's figures, or None when the API does not know it}, or None
        when the API cannot be used (see `error`). `names`: queues known to exist.

        One GET per queue, in parallel, rather than one listing of the vhost: its cost
        is the flow's handful of queues, never the vhost's thousands.
        """
        try:
            docs = await asyncio.gather(
                *(self._get(session, "queues", vhost, n, columns=QUEUE_COLUMNS) for n in names)
            )
        except _Unusable as exc:
            self._failed(str(exc))
            return None
        if names and not any(isinstance(d, dict) for d in docs):
            # The caller asks only for queues AMQP has just found, and the API lists a
            # queue from its declaration on: 404 for all of them is another web server.
            self._failed("not a RabbitMQ management API (404 for queues that exist)")
            return None
        self._answered()
        return {n: d if isinstance(d, dict) else None for n, d in zip(names, docs, strict=True)}

    async def nodes(self, session: Any) -> list[dict[str, Any]] | None:
        """Every node's memory figures (/api/nodes), or None when the API cannot be used."""
        try:
            doc = await self._get(session, "nodes", columns=NODE_COLUMNS)
        except _Unusable as exc:
            self._failed(str(exc))
            return None
        if not isinstance(doc, list):
            self._failed("not a RabbitMQ management API (/api/nodes is not a list)")
            return None
        self._answered()
        return [d for d in doc if isinstance(d, dict)]

    async def _get(self, session: Any, *segments: str, columns: str) -> Any:
        """The JSON of GET /api/SEGMENTS; None for a 404; _Unusable for anything else."""
        import aiohttp

        # Every segment quoted whole: the vhost "/" is %2F, as the API wants it.
        url = self.base.joinpath(*(quote(s, safe="") for s in segments), encoded=True).with_query(
            columns=columns
        )
        try:
            # No redirects: the Authorization header must go to this API and nowhere
            # else; a redirect (a proxy's login page, say) is reported as its status.
            async with session.get(url, allow_redirects=False) as r:
                if r.status == 404:
                    return None
                if r.status != 200:
                    raise _Unusable(_status_words(r.status))
                return await r.json(content_type=None)
        except _Unusable:
            raise
        except TimeoutError:
            raise _Unusable(f"no answer within {TIMEOUT:g}s") from None
        except aiohttp.ClientConnectorError as exc:
            raise _Unusable(f"cannot connect ({_os_words(exc)}): is the plugin enabled?") from None
        except (aiohttp.ClientError, ValueError) as exc:  # ValueError: a body that is not JSON
            what = type(exc).__name__
            raise _Unusable(f"not a RabbitMQ management API answer ({what})") from None

    def _failed(self, why: str) -> None:
        why = redact_text(why)
        if self.available is not False:  # once per outage, not once per read
            log.warning(
                "RabbitMQ management API %s: %s; unacked and memory figures unknown",
                self.url,
                why,
                extra={"event": "management-api-unusable"},
            )
        self.available, self.error = False, why
        return None

    def _answered(self) -> None:
        self.available, self.error = True, None


class _Unusable(Exception):
    """The API did not answer usefully; its text is one line for `error`."""


_STATUS_WORDS = {
    # RabbitMQ answers 401 also for a right password of a user with no management tag,
    # and for a queue of a vhost the user has no permission on (measured on 3.10).
    401: "login refused (401): a wrong user or password, a user without the monitoring"
    " tag, or without access to the vhost",
    403: "the user may not read this (403): it needs the monitoring or management tag",
}


def _status_words(status: int) -> str:
    return _STATUS_WORDS.get(status, f"HTTP {status}")


def _os_words(exc: Any) -> str:
    os_error = getattr(exc, "os_error", None)
    return getattr(os_error, "strerror", None) or type(exc).__name__


def management_api(amqp_url: str, override: str | None = None) -> ManagementApi | None:
    """The management API to read with `amqp_url`'s broker, or None when it is turned off.

    `override`: an explicit http(s):// URL, or "off" / "" to disable; None means
    EAI_RABBITMQ_API if set (the same values), else the AMQP host's port 15672
    (https 15671 for amqps://). UsageError (exit 2, masked) for a URL that cannot be
    an API's.
    """
    from yarl import URL

    label = "--management-url "
    if override is None:
        override = os.environ.get(ENV_API)
        label = f"{ENV_API}="
    if override is not None and override.strip().lower() in OFF:
        return None
    broker = URL(amqp_url)
    login, password = broker.user or "guest", broker.password or "guest"
    if override is None:
        secure = broker.scheme == "amqps"
        base = URL.build(
            scheme="https" if secure else "http",
            host=broker.host or "127.0.0.1",
            port=HTTPS_PORT if secure else HTTP_PORT,
        )
        return ManagementApi(base / "api", login, password, str(base))
    # check_url remembers its password first: masked in every later text.
    override = check_url(override.strip(), label, ("http", "https"), "a management API's port")
    given = URL(override)
    if given.user is not None:  # the override's own login, whole
        login, password = given.user, given.password or ""
    base = given.with_user(None).with_query(None).with_fragment(None)
    # The API's root: the UI's URL, or that URL's /api (a proxy prefix is kept).
    parts = [p for p in base.raw_parts if p not in ("/", "")]
    if parts and parts[-1] == "api":
        parts.pop()
    root = base.with_path("/").joinpath(*parts, "api", encoded=True)
    return ManagementApi(root, login, password, redact_url(override))
