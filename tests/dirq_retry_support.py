"""A scripted HTTP partner and queue helpers for the directory queue's retry tests.

`ScriptedPartner` answers POST /api/x by the body's "id": the statuses planned for
that id in turn (with optional Retry-After), then 201 for its first success and 409
after (it remembers what it accepted, like the invoice stub), and records every call
with its time. It runs in the test's own process, so a consumer killed with -9 does
not take the record of its calls with it.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from cli_support import invoke
from support import http_server


@dataclass
class Call:
    id: str
    at: float
    status: int


@dataclass
class ScriptedPartner:
    url: str = ""
    # id -> [(status, retry_after | None), …] answered in turn before the default
    plan: dict[str, list[tuple[int, int | None]]] = field(default_factory=dict)
    # every id not in `plan` fails this many times with 503 first (a flaky partner)
    fail_first: int = 0
    calls: list[Call] = field(default_factory=list)
    accepted: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _seen: Counter[str] = field(default_factory=Counter)

    def answer(self, ident: str) -> tuple[int, int | None]:
        with self.lock:
            n = self._seen[ident]
            self._seen[ident] += 1
            script = self.plan.get(ident)
            if script is not None and n < len(script):
                status, after = script[n]
            elif script is None and n < self.fail_first:
                status, after = 503, None
            elif ident in self.accepted:
                status, after = 409, None
            else:
                self.accepted.add(ident)
                status, after = 201, None
            self.calls.append(Call(ident, time.time(), status))
            return status, after

    def settled(self, quiet: float = 0.3, timeout: float = 10.0) -> None:
        """Wait until no call has come for `quiet` seconds.

        A consumer killed with -9 may have sent requests that this server has not
        answered (nor recorded) yet: they are still in its accept queue. Counting
        its calls before those are in would miss a call the kill caught.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                last = self.calls[-1].at if self.calls else 0.0
            if time.time() - last >= quiet:
                return
            time.sleep(0.05)

    def times(self, ident: str) -> list[float]:
        with self.lock:
            return [c.at for c in self.calls if c.id == ident]

    def successes(self) -> Counter[str]:
        """Calls per id that the partner took as done (201 created, 409 already had it)."""
        with self.lock:
            return Counter(c.id for c in self.calls if c.status in (201, 409))

    def by_id(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = defaultdict(list)
        with self.lock:
            for c in self.calls:
                out[c.id].append(c.status)
        return out


@contextmanager
def scripted_partner(**kw: object) -> Iterator[ScriptedPartner]:
    p = ScriptedPartner(**kw)  # type: ignore[arg-type]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            ident = str(json.loads(body).get("id"))
            status, after = p.answer(ident)
            self.send_response(status)
            if after is not None:
                self.send_header("Retry-After", str(after))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with http_server(Handler) as url:
        p.url = f"{url}/api/x"
        yield p


def make_queue(root: Path, ids: list[str], name: str = "q") -> Path:
    """A queue whose inbox holds one {"id": …} file per id (m-<id>.json)."""
    q = root / name
    r = invoke("dirq", "init", str(q))
    assert r.returncode == 0, r.stderr
    for i in ids:
        (q / "inbox" / f"m-{i}.json").write_text(json.dumps({"id": i}))
    return q


def flags(url: str, *more: str) -> list[str]:
    """`dirq consume` flags of an HTTP flow over make_queue's messages."""
    return ["--id-field", "id", "--url", url, "--json", *more]


def files(q: Path, folder: str) -> list[str]:
    """Message names in one folder (processing/: in every claim folder), sorted."""
    base = q / folder
    if not base.is_dir():
        return []
    out = []
    for p in base.iterdir():
        if p.name.startswith("."):
            continue
        if p.is_dir():
            out += [c.name for c in p.iterdir() if not c.name.startswith(".")]
        else:
            out.append(p.name)
    return sorted(out)


def all_places(q: Path) -> dict[str, list[str]]:
    return {f: files(q, f) for f in ("inbox", "processing", "retry", "done", "error")}


def mtime(path: Path) -> float:
    return os.lstat(path).st_mtime
