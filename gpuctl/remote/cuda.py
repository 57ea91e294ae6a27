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
from gpuctl.remote._errors import OutOfMemoryError as _OutOfMemoryError

#: Same words as the worker's NumPy executor.
RAWKERNEL_NEEDS_GPU = "RawKernel needs a GPU node (this lease runs on the NumPy executor)"


class _Memory:
    """Namespace standing for ``cupy.cuda.memory``."""

    OutOfMemoryError = _OutOfMemoryError


memory = _Memory()
OutOfMemoryError = _Memory.OutOfMemoryError


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

    @property
    def mem_info(self) -> tuple[int, int]:
        """(free_bytes, total_bytes) of the lease's slice, as runtime.memGetInfo() (a round trip)."""
        return runtime.memGetInfo()

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def get_device_id() -> int:
    return 0


class Stream:
    """``cupy.cuda.Stream``: accepted so code that uses streams runs, but every op of a connection
    runs in order on the worker's one stream (no concurrency between streams). ``synchronize()``
    waits for every queued op of the default connection; ``with stream:`` does nothing else."""

    null: Stream

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False):
        self.null_stream = bool(null)

    def synchronize(self) -> None:
        get_connection().sync("sync")

    def use(self) -> Stream:
        return self

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def done(self) -> bool:
        """True once every queued op has run (a synchronization point here)."""
        self.synchronize()
        return True


Stream.null = Stream(null=True)


def get_current_stream() -> Stream:
    return Stream.null


class MemoryPool:
    """``cupy.get_default_memory_pool()`` for the lease: used_bytes is the memory held by the lease's
    live arrays and total_bytes the same (the worker frees as arrays die; there is no cache to
    free); get_limit is the slice's quota. Each figure is a round trip. set_limit only lowers
    nothing: the quota is the lease's and raises ValueError above it."""

    def used_bytes(self) -> int:
        return int(get_connection().sync("stats")["memory_in_use_bytes"])

    def total_bytes(self) -> int:
        return self.used_bytes()

    def free_bytes(self) -> int:
        return 0

    def free_all_blocks(self, stream: Any = None) -> None:
        """Nothing to free: the worker's pool is not visible to the client."""

    def n_free_blocks(self) -> int:
        return 0

    def get_limit(self) -> int:
        return int(get_connection().quota_bytes)

    def set_limit(self, size: int | None = None, fraction: float | None = None) -> None:
        quota = int(get_connection().quota_bytes)
        want = int(size) if size is not None else int((fraction or 0) * quota)
        if want > quota:
            raise ValueError(f"set_limit: {want} bytes is more than the lease's quota of {quota} bytes")


class PinnedMemoryPool:
    """``cupy.get_default_pinned_memory_pool()``: the client has no pinned memory; all figures 0."""

    def used_bytes(self) -> int:
        return 0

    def total_bytes(self) -> int:
        return 0

    def free_all_blocks(self) -> None:
        """Nothing to free."""

    def n_free_blocks(self) -> int:
        return 0


_POOL = MemoryPool()
# cupy.cuda.MemoryPool / PinnedMemoryPool are the classes above
_PINNED = PinnedMemoryPool()


def get_default_memory_pool() -> MemoryPool:
    return _POOL


def get_default_pinned_memory_pool() -> PinnedMemoryPool:
    return _PINNED


class ElementwiseKernel:
    """``cupy.ElementwiseKernel(in_params, out_params, operation, name)``: compiled and run by the
    worker's CuPy (GPU nodes only; the NumPy executor raises NotImplementedError). Call with the
    input arrays (and optionally the outputs); outputs not given are allocated with the broadcast
    shape of the inputs and the dtype named in out_params (type placeholders like ``T`` take the
    dtype of the first input). No reduce_dims/preamble/options beyond ``preamble``."""

    def __init__(self, in_params: str, out_params: str, operation: str, name: str = "kernel",
                 preamble: str = "", **_: Any):
        for v, what in ((in_params, "in_params"), (out_params, "out_params"), (operation, "operation"),
                        (name, "name"), (preamble, "preamble")):
            if not isinstance(v, str):
                raise TypeError(f"ElementwiseKernel: {what} must be str")
        self.in_params, self.out_params, self.operation, self.name = in_params, out_params, operation, name
        self.preamble = preamble
        self.n_in = len([p for p in in_params.split(",") if p.strip()])
        self.outs = [p.split() for p in out_params.split(",") if p.strip()]

    def __call__(self, *args: Any, size: int | None = None) -> Any:
        import numpy as np

        from gpuctl.remote._infer import broadcast_or_raise, shape_of
        from gpuctl.remote._ndarray import _Temps, conn_of, dtype_name, ndarray, operand

        conn = conn_of(*args)
        if conn.executor == "numpy":
            raise NotImplementedError("ElementwiseKernel needs a GPU node (this lease runs on the NumPy executor)")
        ins, outs = list(args[:self.n_in]), list(args[self.n_in:])
        if len(ins) != self.n_in:
            raise TypeError(f"{self.name}: {self.n_in} input arguments are needed, got {len(ins)}")
        temps = _Temps()
        shape = broadcast_or_raise(*[shape_of(a) for a in ins])
        first = next((a for a in ins if isinstance(a, ndarray)), None)
        made = []
        for i in range(len(outs), len(self.outs)):
            tname = self.outs[i][0]
            try:
                dt = np.dtype(tname)
            except TypeError:
                dt = first.dtype if first is not None else np.dtype(np.float64)
            from gpuctl.remote import empty

            made.append(empty(shape, dtype=dt))
        outs = outs + made
        conn.enqueue("elementwise_kernel", [], [self.in_params, self.out_params, self.operation, self.name,
                                                self.preamble, [operand(conn, a, temps) for a in ins + outs]])
        del dtype_name
        return outs[0] if len(outs) == 1 else tuple(outs)


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
