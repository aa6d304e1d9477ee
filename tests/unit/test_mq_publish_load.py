"""`onceq mq publish` before the wire: what it imports at start, and how it reads a file.

The command is timed with its start-up (bench/mq_publish_rate.py), so its module
must not load the consume side (the transport, its settling and preflight) for the
one name it shares with it, the copy header. Files are read with os.open/fstat/read
(`message_files._read`): the size is still checked before a byte is read, and a file
without one (a pipe) is read to its end, under the same limit.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from onceq._sources import message_files
from onceq._sources.amqp.copy_header import COPY_HEADER
from onceq._sources.amqp.publisher import load_message, load_messages
from onceq._sources.amqp.transport import COPY_HEADER as TRANSPORT_COPY_HEADER
from onceq.errors import BadMessage, NotFound


def test_the_publish_command_loads_nothing_of_the_consume_side() -> None:
    code = "import sys\nimport onceq._cli.mq_publish\nprint(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    assert "onceq._sources.amqp.publisher" in loaded
    consume_side = {
        "onceq._sources.amqp.transport",
        "onceq._sources.amqp.topology",
        "onceq._sources.amqp.settle",
        "onceq._sources.amqp.preflight",
        "secrets",  # the copy header's random bytes come from os.urandom
    }
    assert not loaded & consume_side, loaded & consume_side


def test_the_consumer_reads_the_header_the_publisher_writes() -> None:
    assert TRANSPORT_COPY_HEADER is COPY_HEADER == "x-onceq-copy"


def test_a_file_is_read_whole_and_checked(tmp_path: Path) -> None:
    p = tmp_path / "a.json"
    body = b'\xef\xbb\xbf{"guid": "g-1", "pad": "' + b"x" * 100_000 + b'"}'
    p.write_bytes(body)
    m = load_message(p)
    assert (m.path, m.body, m.msg_id) == (p, body, "g-1")  # the exact bytes, BOM and all


def test_too_large_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "big.json"
    p.write_bytes(b'{"guid": "g"}' + b" " * 100)
    monkeypatch.setattr(message_files, "MAX_BODY", 50)
    reads: list[int] = []
    real_read = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: reads.append(n) or real_read(fd, n))
    with pytest.raises(BadMessage, match=r"too large \(113 bytes; the broker accepts at most 50\)"):
        load_message(p)
    assert reads == []


def test_a_pipe_is_read_to_its_end_under_the_same_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo = tmp_path / "fifo"

    def feed(data: bytes) -> threading.Thread:
        os.mkfifo(fifo)

        def write() -> None:
            # The reader stops at the limit and closes its end: the rest is refused.
            with contextlib.suppress(BrokenPipeError), fifo.open("wb") as w:
                for i in range(0, len(data), 7):
                    w.write(data[i : i + 7])
                    w.flush()

        t = threading.Thread(target=write)
        t.start()
        return t

    body = b'{"guid": "from-a-pipe", "n": ' + b"1" * 40 + b"}"
    t = feed(body)
    assert load_message(fifo).body == body
    t.join()
    fifo.unlink()
    monkeypatch.setattr(message_files, "MAX_BODY", 20)
    t = feed(body)
    with pytest.raises(BadMessage, match="too large"):
        load_message(fifo)
    t.join(timeout=10)


def test_missing_unreadable_and_directory_paths_say_why(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="no such file"):
        load_message(tmp_path / "nope.json")
    with pytest.raises(BadMessage, match="cannot read: Is a directory"):
        load_message(tmp_path)
    good = tmp_path / "g.json"
    good.write_text('{"guid": "g"}')
    with pytest.raises(NotFound, match=r"nope\.json: no such file; nothing was published"):
        load_messages([good, tmp_path / "nope.json"])
