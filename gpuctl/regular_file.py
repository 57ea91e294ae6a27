"""Read a small file that must be a regular file: never a FIFO, device, socket or directory.

`gpuctl --config /dev/zero` once read without end, a FIFO hung forever, and a config inside an
untraversable directory died with a traceback. `read_regular_file` opens without blocking
(O_NONBLOCK: opening a FIFO with no writer returns at once), checks with fstat on the open file
that it is a regular file (so a swap between check and read cannot fool it), reads at most
`max_bytes` (+1 to tell an oversized file) and names the reason in words when it refuses.
"""

from __future__ import annotations

import errno
import os
import stat

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class UnreadableFile(Exception):
    """The file is missing, not a regular file, too large or unreadable. ``reason``: words for a
    message after the path (e.g. "is a FIFO (named pipe), not a regular file"); ``missing``: True
    when nothing (not even a dangling link) is at the path."""

    def __init__(self, reason: str, *, missing: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.missing = missing


def _open_error(path: str, e: OSError) -> UnreadableFile:
    if e.errno == errno.ENOENT:
        if os.path.islink(path):
            return UnreadableFile(f"is a symbolic link to {os.readlink(path)!r}, which does not exist (dangling link)")
        return UnreadableFile("no such file", missing=True)
    if e.errno == errno.ELOOP:
        return UnreadableFile("is a symbolic link loop (too many levels of symbolic links)")
    if e.errno == errno.EACCES:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.access(parent, os.X_OK):
            return UnreadableFile(f"permission denied: the directory {parent} (or one above it) cannot be "
                                  "traversed (no x permission)")
        return UnreadableFile("permission denied: the file is not readable by this user")
    if e.errno == errno.ENOTDIR:
        return UnreadableFile("a component of the path is not a directory")
    try:  # e.g. ENXIO for a socket: say what it is
        kind = _kind(os.stat(path).st_mode)
    except OSError:
        kind = None
    if kind:
        return UnreadableFile(f"is {kind}, not a regular file")
    return UnreadableFile(f"cannot open it: {e.strerror or e}")


def _kind(mode: int) -> str | None:
    """Words for a file type that is not a regular file, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((words for test, words in _KINDS if test(mode)), "an unknown kind of file")


def read_regular_file(path: str | os.PathLike, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path` (symlinks followed), at most `max_bytes` long.

    Raises UnreadableFile naming the reason: missing, dangling link, symlink loop, permission
    (file or directory), not a regular file (directory, FIFO, device, socket), larger than
    `max_bytes`, or a read error."""
    p = os.fspath(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise _open_error(p, e) from None
    try:
        st = os.fstat(fd)
        kind = _kind(st.st_mode)
        if kind:
            raise UnreadableFile(f"is {kind}, not a regular file")
        if st.st_size > max_bytes:
            raise UnreadableFile(f"is {st.st_size} bytes, more than the {max_bytes} bytes a config may have")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(65536, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise UnreadableFile(f"grew past the {max_bytes} bytes a config may have while being read")
        return b"".join(chunks)
    except OSError as e:
        raise UnreadableFile(f"cannot read it: {e.strerror or e}") from None
    finally:
        os.close(fd)
