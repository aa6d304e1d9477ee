"""File moves a queue can trust: atomic writes, no-clobber moves, durable folders.

rename(2) silently replaces its target, so nothing here moves a message with it
except into a folder that only its owner writes. Moves between shared folders go
by link + unlink: EEXIST refuses to replace a file, and a crash between the two
leaves the same inode in both places, which the next attempt recognises.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from onceq.errors import UsageError


def is_message_name(name: str) -> bool:
    """Dotfiles and *.tmp are a producer's partial writes, not messages (yet)."""
    return not name.startswith(".") and not name.endswith(".tmp")


def check_name(name: str) -> str:
    """A plain file name inside one folder, or UsageError."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise UsageError(f"{name!r}: not a plain file name")
    return name


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(folder: Path, name: str, data: bytes) -> Path:
    """Write folder/name the producer's way: .name.tmp, fsync, rename (never half a file)."""
    tmp = folder / f".{name}.{secrets.token_hex(4)}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, folder / name)
    return folder / name


def move_no_clobber(
    src: str | Path,
    dst: str | Path,
    *,
    src_dir_fd: int | None = None,
    dst_dir_fd: int | None = None,
) -> Path:
    """Move src to dst without ever replacing dst; returns where it went.

    rename(2) silently replaces its target, so a file goes by link + unlink. A
    crash between the two leaves the same inode in both places; the next attempt
    finds dst identical and only drops src. A different file already at dst makes
    the move go to dst.1, dst.2 …: a queue never loses a message to a name clash.
    With `src_dir_fd` / `dst_dir_fd`, src / dst are names inside those folders.
    """
    target, linked = link_no_clobber(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
    if linked:
        os.unlink(src, dir_fd=src_dir_fd)
    return target


def link_no_clobber(
    src: str | Path,
    dst: str | Path,
    *,
    src_dir_fd: int | None = None,
    dst_dir_fd: int | None = None,
) -> tuple[Path, bool]:
    """The first half of `move_no_clobber`: link src at dst (or dst.1 …).

    Returns (where it went, whether src still has to be unlinked). A folder is
    moved whole by rename at once (link(2) refuses folders), so it has nothing left
    to unlink.
    """
    # Plain strings, open folder descriptors (no path walk per call), and link(2)
    # tried first with no stat before it: this runs once per message on the hot
    # path, and link itself is the existence check.
    src, dst = os.fspath(src), os.fspath(dst)
    n, target = 0, dst
    while True:
        try:
            os.link(
                src, target, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd, follow_symlinks=False
            )
            return Path(target), True
        except FileExistsError:
            if _same_file(src, target, src_dir_fd, dst_dir_fd):
                return Path(target), True  # a crash fell between link and unlink
            n += 1
            target = f"{dst}.{n}"
        except PermissionError:
            # link(2) refuses a directory (EPERM). A folder someone dropped in the
            # queue moves whole, by rename to a name that is free: it sits in our
            # private processing folder, so nobody races us for the source.
            if not stat.S_ISDIR(os.lstat(src, dir_fd=src_dir_fd).st_mode):
                raise
            target = _free_name(dst, dst_dir_fd)
            os.rename(src, target, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
            return Path(target), False


def _exists(name: str, dir_fd: int | None) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def _free_name(dst: str, dir_fd: int | None = None) -> str:
    n, target = 0, dst
    while _exists(target, dir_fd):
        n += 1
        target = f"{dst}.{n}"
    return target


def _same_file(a: str, b: str, a_fd: int | None = None, b_fd: int | None = None) -> bool:
    try:
        sa, sb = os.lstat(a, dir_fd=a_fd), os.lstat(b, dir_fd=b_fd)
    except FileNotFoundError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def open_dir(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)
