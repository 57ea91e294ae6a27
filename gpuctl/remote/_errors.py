"""Errors of the remote arrays that both the connection and ``gpuctl.remote.cuda`` name (kept
apart so that the connection does not import the cuda module that imports it)."""

from __future__ import annotations

class _Memory:
    """Namespace standing for ``cupy.cuda.memory``."""

    class OutOfMemoryError(MemoryError):
        """The slice's memory quota would be exceeded. The message names the op, the bytes it
        needed, the bytes in use and the quota. The lease stays usable: free arrays and go on."""


memory = _Memory()
OutOfMemoryError = _Memory.OutOfMemoryError
