"""The NumPy executor: runs the allow-listed operations with NumPy on the CPU (simulated nodes,
tests). Same interface as :mod:`gpuctl.datapath.executor_cupy`."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

RAWKERNEL_NEEDS_GPU = "RawKernel needs a GPU node (this lease runs on the NumPy executor)"


class NumpyExecutor:
    """Executes ops with NumPy. Memory quota is enforced by the worker's accounting (bytes held by
    live handles, views counted once per root buffer); temporaries inside one op are not counted.
    compute_share is recorded only (a CPU process has no SM share)."""

    name = "numpy"
    xp = np

    def __init__(self, quota_bytes: int, compute_share: float = 1.0):
        self.quota_bytes = int(quota_bytes)
        self.compute_share = float(compute_share)

    @staticmethod
    def root(arr: np.ndarray) -> tuple[Any, int]:
        """The array owning `arr`'s memory and its size in bytes (views share their base's root)."""
        base = arr
        while isinstance(base.base, np.ndarray):
            base = base.base
        return base, base.nbytes

    @staticmethod
    def upload(dtype: str, shape: tuple[int, ...], fill: Callable[[memoryview], None]) -> np.ndarray:
        """A new array of `dtype`/`shape` whose bytes `fill` reads straight into it (recv_into)."""
        arr = np.empty(shape, dtype=dtype)
        if arr.nbytes:
            fill(memoryview(arr).cast("B"))
        return arr

    @staticmethod
    def host_chunks(arr: np.ndarray) -> Iterator[memoryview]:
        """The bytes of `arr` in C order, as memoryviews to send (no copy when contiguous)."""
        a = np.ascontiguousarray(arr)
        if a.nbytes:
            yield memoryview(a).cast("B")

    @staticmethod
    def download(arr: np.ndarray) -> list[memoryview]:
        """The bytes of `arr` in C order to answer a GET (nothing to wait for on the CPU)."""
        a = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
        return [memoryview(a).cast("B")] if a.nbytes else []

    @staticmethod
    def asarray(value: Any) -> np.ndarray:
        """An op's result as an array (NumPy reductions return scalars; CuPy returns 0-d arrays)."""
        return value if isinstance(value, np.ndarray) else np.asarray(value)

    @staticmethod
    def is_array(value: Any) -> bool:
        return isinstance(value, np.ndarray)

    @staticmethod
    def new_rng(seed: int | None) -> np.random.RandomState:
        """A generator for the connection: the legacy RandomState, so seeded draws equal local
        ``numpy.random.seed(s); numpy.random.rand(...)``."""
        return np.random.RandomState(seed)

    def rawkernel(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(RAWKERNEL_NEEDS_GPU)

    def elementwise_kernel(self, *args: Any) -> None:
        raise NotImplementedError("ElementwiseKernel needs a GPU node (this lease runs on the NumPy executor)")

    def synchronize(self) -> None:
        """Nothing to wait for on the CPU."""

    @staticmethod
    def is_oom(exc: BaseException) -> bool:
        return isinstance(exc, MemoryError)

    def describe(self) -> dict[str, Any]:
        return {"executor": self.name, "device": "cpu", "numpy": np.__version__}
