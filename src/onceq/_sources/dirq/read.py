"""Reading a claimed file into a Delivery: never following a link, never blocking.

The file is in the consumer's own claim folder, so nobody else moves it; but what
the name points to is whatever a producer (or an attacker) put in the queue: a
symlink, a folder, a FIFO, a file another user may not read, a file larger than
any message. Each becomes a delivery the decoder quarantines with a reason,
instead of a read that follows, blocks or fills memory.
"""

from __future__ import annotations

import os
from stat import S_ISDIR, S_ISLNK, S_ISREG

from onceq._core.transport import Delivery


def read_claim(name: str, own: int, max_bytes: int, redelivered: bool = False) -> Delivery:
    """The delivery of claim `name` in the folder `own` (a descriptor)."""
    st = os.lstat(name, dir_fd=own)  # one stat says what it is; nothing below follows a link
    mode, size = st.st_mode, st.st_size
    if not S_ISREG(mode):
        kind = "symlink" if S_ISLNK(mode) else "folder" if S_ISDIR(mode) else "special"
        # special: a FIFO or device, whose opening could block forever; none is opened.
        return Delivery(b"", name, None, redelivered, True, name, {"kind": kind, "size": size})
    if size > max_bytes:  # never read into memory: the decoder says too-large
        return Delivery(b"", name, None, redelivered, True, name, {"kind": "file", "size": size})
    # O_NOFOLLOW: a symlink swapped in after the lstat is refused, not followed.
    # O_NONBLOCK: nor does a FIFO swapped in make us wait for a writer.
    try:
        fd = os.open(name, _READ, dir_fd=own)
    except OSError as exc:
        # Another user's file we may not read: it is quarantined (replayable once its
        # mode is fixed) rather than stopping the queue behind it.
        headers = {"kind": "unreadable", "size": size, "detail": exc.strerror or str(exc)}
        return Delivery(b"", name, None, redelivered, True, name, headers)
    try:
        # One read of what the lstat promised plus one byte: a file that grew past the
        # limit meanwhile is seen as too large, no buffer of max_bytes is allocated for
        # a small message, and a short read of a regular file is its end (no extra read
        # to see EOF).
        body = os.read(fd, size + 1)
    finally:
        os.close(fd)
    return Delivery(body, name, None, redelivered, True, name, {"kind": "file", "size": len(body)})


_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
