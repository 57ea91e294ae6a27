"""One rule for every file gpuctld must not lose: write atomically and durably.

A temp file in the same directory is written, flushed and fsync'ed, renamed over the target, and
the directory is fsync'ed: a daemon killed at any instant leaves either the old or the new file,
never a mix. Used by the state file (gpuctl.daemon.state) and the schedule file
(gpuctl.daemon.schedule). Stdlib only.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync_directory(directory: Path) -> None:
    """fsync a directory, so a rename or a new file in it survives a power cut."""
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_atomically(path: Path, payload: bytes) -> None:
    """Replace `path` with `payload` (bytes) atomically and durably (see the module docstring).

    Creates the parent directory. Raises OSError when the disk refuses; the previous file is then
    untouched and no temp file is left behind.
    """
    path = Path(path)
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_directory(directory)
