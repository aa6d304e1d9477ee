"""Reading a claimed file into a Delivery: never following a link, never blocking.

The file is in the consumer's own claim folder, so nobody else moves it; but what
the name points to is whatever a producer (or an attacker) put in the queue: a
symlink, a folder, a FIFO, a file another user may not read, a file larger than
any message. Each becomes a delivery the decoder quarantines with a reason,
instead of a read that follows, blocks or fills memory.
"""

from __future__ import annotations

import os
import stat

from onceq._core.transport import Delivery


def read_claim(name: str, own: int, max_bytes: int, redelivered: bool = False) -> Delivery:
    """The delivery of claim `name` in the folder `own` (a descriptor)."""
    st = os.lstat(name, dir_fd=own)  # one stat says what it is; nothing below follows a link
    headers: dict[str, object] = {"kind": "file", "size": st.st_size}
    body = b""
    if stat.S_ISLNK(st.st_mode):
        headers["kind"] = "symlink"
    elif stat.S_ISDIR(st.st_mode):
        headers["kind"] = "folder"
    elif not stat.S_ISREG(st.st_mode):
        headers["kind"] = "special"  # a FIFO or device: opening it could block forever
    elif st.st_size <= max_bytes:
        # O_NOFOLLOW: a symlink swapped in after the lstat is refused, not followed.
        # O_NONBLOCK: nor does a FIFO swapped in make us wait for a writer.
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=own)
        except OSError as exc:
            # Another user's file we may not read: it is quarantined (replayable
            # once its mode is fixed) rather than stopping the queue behind it.
            headers["kind"] = "unreadable"
            headers["detail"] = exc.strerror or str(exc)
            return Delivery(
                b"", name, redelivered=redelivered, stable_ref=True, token=name, headers=headers
            )
        try:
            # Read what the lstat promised plus one byte, up to the limit + 1: a
            # file that grew past the limit meanwhile is seen as too large, and
            # no buffer of max_bytes is allocated for a small message. A short
            # read of a regular file is its end: no extra read to see EOF.
            want = min(st.st_size, max_bytes) + 1
            chunks = []
            while want > 0 and (chunk := os.read(fd, want)):
                chunks.append(chunk)
                if len(chunk) < want:
                    break
                want -= len(chunk)
        finally:
            os.close(fd)
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        headers["size"] = len(body)
    return Delivery(
        body=body,
        ref=name,
        redelivered=redelivered,
        stable_ref=True,
        token=name,
        headers=headers,
    )
