"""A scripted claim system in the test process: each call's answer chosen per guid.

The partner stub (`onceq partner claim`) answers by the claim's content, always the
same way; a retry test needs "503, 503, then 201" for one message and the time of
every call. This is a real HTTP server on loopback (a thread of the test process),
called by a real `onceq mq consume` process.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from typing import Any

from support import http_server

# An answer: a status, or (status, {header: value}).
Answer = int | tuple[int, dict[str, str]]


class Script:
    """Answers per guid, in order; past the end of a guid's list (or for an unknown
    guid) the default. Records the monotonic time of every call per guid."""

    def __init__(self, answers: dict[str, list[Answer]] | None = None, default: Answer = 201):
        self.answers = {k: list(v) for k, v in (answers or {}).items()}
        self.default = default
        self.calls: dict[str, list[float]] = defaultdict(list)
        self.lock = threading.Lock()

    def next(self, guid: str) -> Answer:
        with self.lock:
            self.calls[guid].append(time.monotonic())
            queue = self.answers.get(guid)
            return queue.pop(0) if queue else self.default

    def times(self, guid: str) -> list[float]:
        with self.lock:
            return list(self.calls[guid])

    def count(self, guid: str) -> int:
        return len(self.times(guid))


def _handler(script: Script) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                guid = str(json.loads(body).get("guid"))
            except (ValueError, AttributeError):
                guid = "?"
            answer = script.next(guid)
            status, headers = answer if isinstance(answer, tuple) else (answer, {})
            out = json.dumps({"guid": guid}).encode()
            self.send_response(status)
            for k, v in {"Content-Type": "application/json", **headers}.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *_args: Any) -> None:
            pass

    return Handler


@contextmanager
def scripted_partner(script: Script) -> Iterator[str]:
    """A claim system answering by `script` for the block; yields its base URL."""
    with http_server(_handler(script)) as url:
        yield url
