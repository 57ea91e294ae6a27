"""The CuPy executor: runs the allow-listed operations on the lease's GPU (GPU nodes).

The launcher sets CUDA_VISIBLE_DEVICES to the lease's GPU, so the worker sees it as device 0, and
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (compute share) where an MPS daemon runs; otherwise GPU time is
shared by time-slicing. CuPy's default memory pool gets ``set_limit(size=quota_bytes)``: any
allocation past the slice's quota (temporaries included) raises cupy's OutOfMemoryError, which the
client receives as ``gpuctl.remote.cuda.memory.OutOfMemoryError``. All work runs on the default
(legacy) stream, so ops, uploads and downloads are ordered as the client queued them.

Transfers go through two pinned host staging buffers per connection thread (CHUNK_BYTES each):
while chunk i is received from the socket into one, chunk i-1 is copied to the device from the
other (and the reverse for downloads), so the network and PCIe overlap.

Tested only on GPU machines (bench/datapath.py --executor cupy); the NumPy executor is its twin
for CPU tests.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterator

import numpy as np

CHUNK_BYTES = 8 << 20
#: Arrays up to this size answer a GET with one synchronous cudaMemcpy into pinned memory.
SMALL_DOWNLOAD_BYTES = 1 << 16
_H2D, _D2H = 1, 2  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost
MAX_KERNEL_SOURCE_BYTES = 1 << 20
MAX_KERNEL_CACHE = 64


class _RandomState:
    """cupy.random.RandomState with the method names the op table uses (randint where missing)."""

    def __init__(self, cupy: Any, seed: int | None):
        self._cp = cupy
        self._rs = cupy.random.RandomState(seed)

    def rand(self, *shape: int) -> Any:
        return self._rs.rand(*shape)

    def randn(self, *shape: int) -> Any:
        return self._rs.randn(*shape)

    def random_sample(self, size: Any = None) -> Any:
        return self._rs.random_sample(size)

    def normal(self, loc: float, scale: float, size: Any) -> Any:
        return self._rs.normal(loc, scale, size)

    def uniform(self, low: float, high: float, size: Any) -> Any:
        return self._rs.uniform(low, high, size)

    def randint(self, low: int, high: int | None, size: Any, dtype: str = "int64") -> Any:
        if hasattr(self._rs, "randint"):
            return self._rs.randint(low, high, size, dtype=dtype)
        lo, hi = (0, low) if high is None else (low, high)
        return (self._rs.interval(hi - lo - 1, size) + lo).astype(dtype)


class CupyExecutor:
    """Executes ops with CuPy on device 0 (the lease's GPU). Same interface as NumpyExecutor."""

    name = "cupy"

    def __init__(self, quota_bytes: int, compute_share: float = 1.0):
        import cupy

        self.cupy = cupy
        self.xp = cupy
        self.quota_bytes = int(quota_bytes)
        self.compute_share = float(compute_share)
        cupy.cuda.Device(0).use()
        self.pool = cupy.get_default_memory_pool()
        self.pool.set_limit(size=self.quota_bytes)
        self._local = threading.local()
        self._kernels: dict[tuple, Any] = {}
        self._kernels_lock = threading.Lock()

    # -- accounting ----------------------------------------------------------------------------
    @staticmethod
    def root(arr: Any) -> tuple[Any, int]:
        """The device allocation behind `arr` (views share it) and its size in bytes."""
        try:
            mem = arr.data.mem
            return mem, int(mem.size)
        except AttributeError:
            return arr, int(arr.nbytes)

    def is_array(self, value: Any) -> bool:
        return isinstance(value, self.cupy.ndarray)

    def asarray(self, value: Any) -> Any:
        return value if isinstance(value, self.cupy.ndarray) else self.cupy.asarray(value)

    def is_oom(self, exc: BaseException) -> bool:
        return isinstance(exc, self.cupy.cuda.memory.OutOfMemoryError)

    def new_rng(self, seed: int | None) -> _RandomState:
        return _RandomState(self.cupy, seed)

    def synchronize(self) -> None:
        """Wait for the device (an asynchronous kernel error surfaces here)."""
        self.cupy.cuda.Device(0).synchronize()

    def describe(self) -> dict[str, Any]:
        props = self.cupy.cuda.runtime.getDeviceProperties(0)
        return {"executor": self.name, "device": props["name"].decode(), "cupy": self.cupy.__version__}

    # -- staging -------------------------------------------------------------------------------
    def _staging(self) -> list[np.ndarray]:
        bufs = getattr(self._local, "bufs", None)
        if bufs is None:
            bufs = []
            for _ in range(2):
                mem = self.cupy.cuda.alloc_pinned_memory(CHUNK_BYTES)
                bufs.append(np.frombuffer(mem, np.uint8, CHUNK_BYTES))
            self._local.bufs = bufs
        return bufs

    def upload(self, dtype: str, shape: tuple[int, ...], fill: Callable[[memoryview], None]) -> Any:
        """A new device array whose bytes are received chunk by chunk into pinned staging and
        copied to the device while the next chunk arrives. Allocation happens before any byte is
        read (an OutOfMemoryError leaves the payload for the caller to drain)."""
        cp = self.cupy
        arr = cp.empty(shape, dtype=dtype)
        nbytes = arr.nbytes
        if not nbytes:
            return arr
        host = self._staging()
        events: list[Any] = [None, None]
        stream_ptr = cp.cuda.get_current_stream().ptr
        try:
            for i, off in enumerate(range(0, nbytes, CHUNK_BYTES)):
                k = i & 1
                n = min(CHUNK_BYTES, nbytes - off)
                if events[k] is not None:
                    events[k].synchronize()  # the copy out of this staging buffer is done
                fill(memoryview(host[k])[:n])
                cp.cuda.runtime.memcpyAsync(arr.data.ptr + off, host[k].ctypes.data, n, _H2D, stream_ptr)
                events[k] = cp.cuda.Event()
                events[k].record()
        finally:
            for e in events:
                if e is not None:
                    e.synchronize()
        return arr

    def download(self, arr: Any) -> Any:
        """The bytes of `arr` in C order to answer a GET, after the work queued before it.

        Small arrays (<= SMALL_DOWNLOAD_BYTES): one synchronous cudaMemcpy on the legacy default
        stream (which every op uses) into this thread's pinned buffer; it returns once the copy,
        and so every earlier op, is done, and raises a pending device error. Larger ones:
        synchronize, then :meth:`host_chunks`. Raises the device's error (CUDARuntimeError).
        """
        cp = self.cupy
        nbytes = int(arr.nbytes)
        if nbytes > SMALL_DOWNLOAD_BYTES:
            self.synchronize()
            return self.host_chunks(arr)
        if not nbytes:
            self.synchronize()
            return []
        small = getattr(self._local, "small", None)
        if small is None:
            mem = cp.cuda.alloc_pinned_memory(SMALL_DOWNLOAD_BYTES)
            small = self._local.small = np.frombuffer(mem, np.uint8, SMALL_DOWNLOAD_BYTES)
        a = arr if arr.flags.c_contiguous else cp.ascontiguousarray(arr)
        cp.cuda.runtime.memcpy(small.ctypes.data, a.data.ptr, nbytes, _D2H)
        return [memoryview(small)[:nbytes]]

    def host_chunks(self, arr: Any) -> Iterator[memoryview]:
        """The bytes of `arr` in C order, as memoryviews of pinned staging; the copy of chunk i+1
        from the device runs while chunk i is sent. Each view is valid until the next is asked."""
        cp = self.cupy
        a = cp.ascontiguousarray(arr)
        nbytes = a.nbytes
        if not nbytes:
            return
        host = self._staging()
        stream_ptr = cp.cuda.get_current_stream().ptr
        offsets = list(range(0, nbytes, CHUNK_BYTES))

        def start(i: int) -> Any:
            off = offsets[i]
            n = min(CHUNK_BYTES, nbytes - off)
            cp.cuda.runtime.memcpyAsync(host[i & 1].ctypes.data, a.data.ptr + off, n, _D2H, stream_ptr)
            ev = cp.cuda.Event()
            ev.record()
            return ev

        ev = start(0)
        for i, off in enumerate(offsets):
            ev.synchronize()
            nxt = start(i + 1) if i + 1 < len(offsets) else None
            yield memoryview(host[i & 1])[: min(CHUNK_BYTES, nbytes - off)]
            ev = nxt

    # -- RawKernel -----------------------------------------------------------------------------
    def rawkernel(self, session: Any, code: Any, name: Any, grid: Any, block: Any, args: Any,
                  options: Any = (), shared_mem: Any = 0) -> None:
        """Compile (cached) and launch CUDA C kernel `name` from `code`. args: device arrays or
        (dtype name, value) pairs for scalars. Raises TypeError/ValueError naming the bad part."""
        cp = self.cupy
        if not isinstance(code, str) or len(code) > MAX_KERNEL_SOURCE_BYTES:
            raise TypeError(f"rawkernel: code must be CUDA C source of at most {MAX_KERNEL_SOURCE_BYTES} bytes")
        if not isinstance(name, str) or not name.isidentifier():
            raise TypeError(f"rawkernel: name must be a C identifier, got {name!r}")
        dims = []
        for what, v in (("grid", grid), ("block", block)):
            if not (isinstance(v, tuple) and 1 <= len(v) <= 3 and all(type(x) is int and x > 0 for x in v)):
                raise ValueError(f"rawkernel: {what} must be 1 to 3 positive ints, got {v!r}")
            dims.append(v)
        if not isinstance(options, tuple) or not all(isinstance(o, str) for o in options):
            raise TypeError("rawkernel: options must be strings")
        if type(shared_mem) is not int or shared_mem < 0:
            raise ValueError(f"rawkernel: shared_mem must be a non-negative int, got {shared_mem!r}")
        kargs = []
        for i, a in enumerate(args if isinstance(args, tuple) else ()):
            if isinstance(a, cp.ndarray):
                kargs.append(a)
            elif isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str):
                kargs.append(np.dtype(a[0]).type(a[1]))
            else:
                raise TypeError(f"rawkernel: argument {i} must be an array or a (dtype, value) scalar")
        key = (code, name, options)
        with self._kernels_lock:
            kern = self._kernels.get(key)
            if kern is None:
                if len(self._kernels) >= MAX_KERNEL_CACHE:
                    self._kernels.pop(next(iter(self._kernels)))
                kern = cp.RawKernel(code, name, options=options)
                self._kernels[key] = kern
        kern(dims[0], dims[1], tuple(kargs), shared_mem=shared_mem)


def _elementwise_kernel(self: CupyExecutor, in_params: Any, out_params: Any, operation: Any, name: Any,
                        preamble: Any, arrays: Any) -> None:
    """Compile (cached with the RawKernels) and run ``cupy.ElementwiseKernel(in_params, out_params,
    operation, name, preamble=...)`` on device arrays `arrays` (inputs then outputs, written in place)."""
    cp = self.cupy
    for v, what in ((in_params, "in_params"), (out_params, "out_params"), (operation, "operation"),
                    (preamble, "preamble")):
        if not isinstance(v, str) or len(v) > MAX_KERNEL_SOURCE_BYTES:
            raise TypeError(f"elementwise_kernel: {what} must be a string of at most {MAX_KERNEL_SOURCE_BYTES} bytes")
    if not isinstance(name, str) or not name.isidentifier():
        raise TypeError(f"elementwise_kernel: name must be a C identifier, got {name!r}")
    if not isinstance(arrays, tuple) or not all(isinstance(a, cp.ndarray) or isinstance(a, (int, float, bool))
                                                for a in arrays):
        raise TypeError("elementwise_kernel: arguments must be arrays or scalars")
    key = ("elementwise", in_params, out_params, operation, name, preamble)
    with self._kernels_lock:
        kern = self._kernels.get(key)
        if kern is None:
            if len(self._kernels) >= MAX_KERNEL_CACHE:
                self._kernels.pop(next(iter(self._kernels)))
            kern = cp.ElementwiseKernel(in_params, out_params, operation, name, preamble=preamble)
            self._kernels[key] = kern
    kern(*arrays)


CupyExecutor.elementwise_kernel = _elementwise_kernel  # type: ignore[attr-defined]
