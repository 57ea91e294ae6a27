"""``gpuctl.remote.cuda``: the parts of ``cupy.cuda`` that remote code uses.

``Device().synchronize()`` waits for every queued op of the default connection (a
synchronization point: raises the first queued error). ``runtime.memGetInfo()`` answers
``(free_bytes, total_bytes)`` *for the lease's slice* (its memory quota), not the whole GPU.
``memory.OutOfMemoryError`` is raised when the slice's quota would be exceeded.
``RawKernel`` runs CUDA C source on GPU nodes only.
"""

from __future__ import annotations

from typing import Any

from gpuctl.remote._connection import get_connection
from gpuctl.remote._errors import OutOfMemoryError, memory  # noqa: F401 - cupy.cuda's names

#: Same words as the worker's NumPy executor.
RAWKERNEL_NEEDS_GPU = "RawKernel needs a GPU node (this lease runs on the NumPy executor)"




class _Runtime:
    """Namespace standing for ``cupy.cuda.runtime``."""

    @staticmethod
    def memGetInfo() -> tuple[int, int]:
        """(free_bytes, total_bytes) of the lease's slice: total is its memory quota, free is the
        quota minus the bytes held by live arrays of the lease (a synchronization point)."""
        r = get_connection().sync("mem")
        return int(r["free_bytes"]), int(r["total_bytes"])

    @staticmethod
    def getDeviceCount() -> int:
        """A lease presents one device."""
        return 1

    @staticmethod
    def deviceSynchronize() -> None:
        get_connection().sync("sync")


runtime = _Runtime()


class Device:
    """The lease's device. Only device 0 exists (a lease presents one slice as one device)."""

    def __init__(self, device: int = 0):
        if int(device) != 0:
            raise ValueError(f"device {device}: a lease presents one device, number 0")
        self.id = 0

    def synchronize(self) -> None:
        """Send every queued op and wait until the worker has run them; raises the first queued
        op's error (naming it)."""
        get_connection().sync("sync")

    def use(self) -> None:
        """Nothing to select: the lease has one device."""

    def __enter__(self) -> "Device":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def get_device_id() -> int:
    return 0


class RawKernel:
    """A CUDA C kernel (``cupy.RawKernel``): compiled and launched on the worker's GPU.

    ``kernel(grid, block, args, shared_mem=0)``: args are remote arrays (passed as device
    pointers) and scalars; give NumPy scalars (``np.int32(n)``, ``np.float32(x)``) for exact C
    types (Python ints go as int64, floats as float64, as CuPy does). On a NumPy executor the call
    raises NotImplementedError("RawKernel needs a GPU node ...").
    """

    def __init__(self, code: str, name: str, options: tuple[str, ...] = (), backend: str = "nvrtc", **_: Any):
        if not isinstance(code, str) or not isinstance(name, str):
            raise TypeError("RawKernel(code, name): both must be str")
        self.code, self.name, self.options = code, name, tuple(options)

    def __call__(self, grid: Any, block: Any, args: tuple, *, shared_mem: int = 0) -> None:
        import numpy as np

        from gpuctl.remote._ndarray import _Temps, conn_of, enc

        conn = conn_of(*args)
        if conn.executor == "numpy":
            raise NotImplementedError(RAWKERNEL_NEEDS_GPU)
        temps = _Temps()
        enc_args = []
        for a in args:
            if isinstance(a, np.generic):
                enc_args.append([{"d": a.dtype.name}, a.item()])
            elif isinstance(a, bool):
                enc_args.append([{"d": "bool"}, a])
            elif isinstance(a, int):
                enc_args.append([{"d": "int64"}, a])
            elif isinstance(a, float):
                enc_args.append([{"d": "float64"}, a])
            else:
                enc_args.append(enc(conn, a, temps))
        grid = tuple(grid) if isinstance(grid, (tuple, list)) else (int(grid),)
        block = tuple(block) if isinstance(block, (tuple, list)) else (int(block),)
        conn.enqueue("rawkernel", [], [self.code, self.name, list(grid), list(block), enc_args,
                                       list(self.options), int(shared_mem)])
