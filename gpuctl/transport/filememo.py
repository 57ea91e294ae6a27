"""A per-process memo of what was read from files, valid while those files are unchanged.

The SSH transport reads the same ssh config, known_hosts and identity files for every node; at 64
nodes that was 64 parses of each (~0.65 ms of client CPU per node, bench/RESULTS.md "Fleet
scale"). :class:`FileMemo` keeps each result with the ``stat`` of every file (and directory) it
depended on and hands it out again only while each of them still has the same device, inode, size,
modification time and change time (ns), so an edited, replaced, created, removed or chmod'ed file
is read again at the next connection, as OpenSSH (a new process per connection) would. The change
time (ctime) is in because nobody can set it: a rewrite that keeps the size and puts the old mtime
back (``cp -p``, ``touch -r``, a restored backup) still moves it. A file changed (ctime) less than
RACY_S before it was read is not remembered (it may change again within one timestamp tick: git's
"racy clean" rule), so a file written and read in the same instant is always read again. And a
value is handed out again only once a computation found its files in the same state before and
after reading them (the first computation of a key only learns which files those are): a file
replaced while it was being read (a symlink swapped to an older file: no fresh ctime) is never
remembered with the state of the file that replaced it.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Generic, Hashable, Iterable, TypeVar

V = TypeVar("V")

#: Seconds: a file modified this recently before it was read is not remembered.
RACY_S = 1.0

#: One path's state: (path, (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)), or (path, None)
#: when missing or unreadable.
Signature = tuple[tuple[str, "tuple[int, int, int, int, int] | None"], ...]


def signature(paths: Iterable[str]) -> Signature:
    """The stat state of `paths`, in order (a missing or unreadable path counts as None)."""
    out = []
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            out.append((p, None))
            continue
        out.append((p, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)))
    return tuple(out)


class FileMemo(Generic[V]):
    """key -> value computed from files, recomputed when any of those files changed.

    maxsize: entries kept (the oldest is dropped past it). Thread-safe; two threads missing at once
    may both compute (the last one is kept). Exceptions from `compute` are not remembered.
    """

    def __init__(self, maxsize: int = 32):
        self.maxsize = maxsize
        #: key -> (signature, value, confirmed: the files had that signature before and after the
        #: computation that gave the value).
        self._entries: dict[Hashable, tuple[Signature, V, bool]] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, compute: Callable[[], tuple[V, Iterable[str] | None]]) -> V:
        """The value for `key`: the remembered one while the stat of each path it depends on is
        unchanged and was unchanged across its computation, else ``compute()``, which returns
        (value, the paths it depends on; None: do not remember this value). The first computation
        of a key is not handed out again (its files' state before reading was not known); the
        second, when the files are unchanged, is."""
        with self._lock:
            entry = self._entries.get(key)
        before = None
        if entry is not None:
            before = signature(p for p, _ in entry[0])  # stat before reading (or re-reading)
            if before == entry[0] and entry[2]:
                with self._lock:
                    self.hits += 1
                return entry[1]
        started_ns = time.time_ns()
        value, paths = compute()
        if paths is None:
            return value
        sig = signature(list(paths))
        racy_ns = started_ns - int(RACY_S * 1e9)
        with self._lock:
            self.misses += 1
            if any(st is not None and max(st[3], st[4]) >= racy_ns for _, st in sig):
                self._entries.pop(key, None)
                return value  # may have changed while it was read: read it again next time
            self._entries.pop(key, None)
            self._entries[key] = (sig, value, before == sig)
            while len(self._entries) > self.maxsize:
                self._entries.pop(next(iter(self._entries)))
        return value

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._entries.clear()
