"""``gpuctl.remote.random``: seeded random arrays made on the worker (``cupy.random`` subset).

Each connection has its own generator; ``seed(s)`` resets it. On the NumPy executor the draws
equal local ``numpy.random.seed(s); numpy.random.rand(...)`` (legacy RandomState); on the CuPy
executor they equal ``cupy.random.seed(s)`` draws. Like CuPy, the sequences differ between the
two: a seed makes runs reproducible on one kind of node, not across kinds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuctl.remote._connection import get_connection
from gpuctl.remote._ndarray import dtype_name, ndarray, new_op


def _size(size: Any) -> list[int] | None:
    if size is None:
        return None
    return [int(size)] if isinstance(size, (int, np.integer)) else [int(d) for d in size]


def _shape_of(size: list[int] | None) -> tuple[int, ...]:
    return tuple(size) if size is not None else ()


def _cast(arr: ndarray, dtype: Any) -> ndarray:
    return arr if dtype is None or np.dtype(dtype) == np.float64 else arr.astype(dtype)


def seed(seed: int | None = None) -> None:
    """Reset the connection's generator with `seed` (int in [0, 2**32), or None for entropy)."""
    get_connection().enqueue("random_seed", [], [None if seed is None else int(seed)])


def rand(*shape: int, dtype: Any = None) -> ndarray:
    """Uniform [0, 1) of `shape` (float64 unless `dtype`)."""
    s = [int(d) for d in shape]
    return _cast(new_op(get_connection(), "rand", [s], None, (tuple(s), np.float64)), dtype)


def randn(*shape: int, dtype: Any = None) -> ndarray:
    """Standard normal of `shape` (float64 unless `dtype`)."""
    s = [int(d) for d in shape]
    return _cast(new_op(get_connection(), "randn", [s], None, (tuple(s), np.float64)), dtype)


def random_sample(size: Any = None, dtype: Any = None) -> ndarray:
    """Uniform [0, 1) of shape `size`."""
    s = _size(size)
    return _cast(new_op(get_connection(), "random_sample", [s], None, (_shape_of(s), np.float64)), dtype)


random = random_sample


def normal(loc: float = 0.0, scale: float = 1.0, size: Any = None, dtype: Any = None) -> ndarray:
    """Normal(loc, scale) of shape `size` (scalar loc/scale)."""
    s = _size(size)
    return _cast(new_op(get_connection(), "normal", [float(loc), float(scale), s], None,
                        (_shape_of(s), np.float64)), dtype)


def uniform(low: float = 0.0, high: float = 1.0, size: Any = None, dtype: Any = None) -> ndarray:
    """Uniform [low, high) of shape `size`."""
    s = _size(size)
    return _cast(new_op(get_connection(), "uniform", [float(low), float(high), s], None,
                        (_shape_of(s), np.float64)), dtype)


def randint(low: int, high: int | None = None, size: Any = None, dtype: Any = "int64") -> ndarray:
    """Integers in [low, high) (or [0, low)) of shape `size`."""
    s = _size(size)
    name = dtype_name(dtype)
    return new_op(get_connection(), "randint", [int(low), None if high is None else int(high), s, {"d": name}],
                  None, (_shape_of(s), np.dtype(name)))
