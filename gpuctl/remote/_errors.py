"""Exceptions of gpuctl.remote that more than one module raises (kept apart so that the
connection can raise OutOfMemoryError without importing gpuctl.remote.cuda)."""

from __future__ import annotations


class OutOfMemoryError(MemoryError):
    """``cupy.cuda.memory.OutOfMemoryError``: the slice's memory quota would be exceeded. The
    message names the op (or the allocating call), the bytes it needed, the bytes in use and the
    quota. The lease stays usable: free arrays and go on."""
