"""The time gpuctld reads for schedules and audit records: injectable, so tests move it.

:class:`Clock` returns Unix time in seconds (``time.time()``) plus an offset. The offset is 0, or
read from a file given with ``gpuctld --clock-offset-file PATH`` (one decimal number of seconds;
re-read when the file changes): a test writes ``3600`` there and the daemon's schedule sees the
time one hour later, with no sleeping. Stdlib only.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable


class Clock:
    """Unix time (s) plus an offset (s).

    offset_file: a file holding the offset in seconds (missing or empty file: 0; a file that is not
    a number keeps the last good offset and is reported once through `warn`). base: the time
    source (``time.time`` by default).
    """

    def __init__(self, offset_file: str | os.PathLike | None = None, *,
                 base: Callable[[], float] = time.time, warn: Callable[[str], None] | None = None):
        self.offset_file = Path(offset_file) if offset_file else None
        self.base = base
        self._warn = warn
        self._offset_s = 0.0
        self._seen: tuple[float, int] | None = None
        self._lock = threading.Lock()

    def offset_s(self) -> float:
        """The current offset, seconds (re-read from the file when its mtime or size changed)."""
        if self.offset_file is None:
            return 0.0
        with self._lock:
            try:
                st = self.offset_file.stat()
            except OSError:
                self._seen, self._offset_s = None, 0.0
                return 0.0
            key = (st.st_mtime, st.st_size)
            if key != self._seen:
                self._seen = key
                text = self.offset_file.read_text(errors="replace").strip()
                try:
                    self._offset_s = float(text) if text else 0.0
                except ValueError:
                    if self._warn:
                        self._warn(f"clock offset file {self.offset_file}: not a number of seconds: {text[:40]!r}; "
                                   f"keeping offset {self._offset_s:g} s")
            return self._offset_s

    def __call__(self) -> float:
        """Unix time now, seconds (with the offset)."""
        return self.base() + self.offset_s()
