"""Per-lease accounting of a data-path worker: memory held by live handles against the slice's
memory quota, bytes in and out, operations, and the JSON stats file the daemon reads.

Memory is counted per *root buffer*: views (slices, reshapes, transposes) of an array share its
root and add nothing; a root is counted once, however many handles of however many connections
of the lease point into it, and released when the last one is freed. The executor tells how to
find an array's root (:meth:`Executor.root`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Callable


class QuotaExceeded(Exception):
    """The slice's memory quota would be exceeded. Message names bytes needed, in use and quota;
    the client raises it as ``gpuctl.remote.cuda.memory.OutOfMemoryError``."""


class LeaseAccounting:
    """Counters of one lease's worker, shared by all its connections (thread-safe).

    quota_bytes: the slice's memory quota in bytes (from the lease). Figures: memory_in_use_bytes
    (bytes of root buffers held by live handles), peak_memory_bytes, bytes_in / bytes_out (frame
    bytes received / sent, headers included), ops_total (operations executed), connections.
    """

    def __init__(self, quota_bytes: int, root: Callable[[Any], tuple[Any, int]]):
        self.quota_bytes = int(quota_bytes)
        self._root = root
        self._lock = threading.Lock()
        self._roots: dict[int, list] = {}  # id(root) -> [root, nbytes, refcount]
        self.memory_in_use_bytes = 0
        self.peak_memory_bytes = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.ops_total = 0
        self.connections = 0
        self.connections_total = 0
        self._rate_mark = (time.monotonic(), 0)
        self.ops_per_s = 0.0

    def check(self, nbytes: int, what: str) -> None:
        """Raise QuotaExceeded when `nbytes` more would not fit in the quota (nothing is reserved)."""
        with self._lock:
            if self.memory_in_use_bytes + nbytes > self.quota_bytes:
                raise QuotaExceeded(self._oom_message(nbytes, what))

    def _oom_message(self, nbytes: int, what: str) -> str:
        return (
            f"slice memory quota exceeded: needs {nbytes} bytes, "
            f"{self.memory_in_use_bytes} of {self.quota_bytes} bytes in use"
        )

    def acquire(self, arr: Any, what: str) -> None:
        """Count a reference to `arr`'s root; raise QuotaExceeded (counting nothing) when a new root
        does not fit."""
        root, nbytes = self._root(arr)
        key = id(root)
        with self._lock:
            entry = self._roots.get(key)
            if entry is not None:
                entry[2] += 1
                return
            if self.memory_in_use_bytes + nbytes > self.quota_bytes:
                raise QuotaExceeded(self._oom_message(nbytes, what))
            self._roots[key] = [root, nbytes, 1]
            self.memory_in_use_bytes += nbytes
            self.peak_memory_bytes = max(self.peak_memory_bytes, self.memory_in_use_bytes)

    def release(self, arr: Any) -> None:
        """Drop a reference counted by :meth:`acquire`; the root's bytes are freed at the last one."""
        root, _ = self._root(arr)
        with self._lock:
            entry = self._roots.get(id(root))
            if entry is None:
                return
            entry[2] -= 1
            if entry[2] <= 0:
                del self._roots[id(root)]
                self.memory_in_use_bytes -= entry[1]

    def add_io(self, bytes_in: int = 0, bytes_out: int = 0, ops: int = 0) -> None:
        """Add to the byte and op counters."""
        with self._lock:
            self.bytes_in += bytes_in
            self.bytes_out += bytes_out
            self.ops_total += ops

    def snapshot(self) -> dict[str, Any]:
        """The counters as JSON: memory_in_use_bytes, peak_memory_bytes, quota_bytes, bytes_in,
        bytes_out, ops_total, ops_per_s (over the time since the previous snapshot), connections."""
        with self._lock:
            now = time.monotonic()
            t0, n0 = self._rate_mark
            if now - t0 >= 0.5:
                self.ops_per_s = (self.ops_total - n0) / (now - t0)
                self._rate_mark = (now, self.ops_total)
            return {
                "memory_in_use_bytes": self.memory_in_use_bytes,
                "peak_memory_bytes": self.peak_memory_bytes,
                "quota_bytes": self.quota_bytes,
                "bytes_in": self.bytes_in,
                "bytes_out": self.bytes_out,
                "ops_total": self.ops_total,
                "ops_per_s": round(self.ops_per_s, 1),
                "connections": self.connections,
                "connections_total": self.connections_total,
            }


def write_stats_file(path: str, data: dict[str, Any]) -> None:
    """Write `data` as JSON to `path` atomically (temp file in the same directory, then rename), so
    a reader never sees half a file."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)
