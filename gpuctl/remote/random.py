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


class Generator:
    """``cupy.random.Generator`` (NumPy's ``Generator`` API subset: random, standard_normal,
    normal, uniform, integers), held by the worker of this connection. On the NumPy executor the
    draws equal local ``numpy.random.default_rng(seed)``'s (PCG64); on GPU nodes they are
    cupy.random.default_rng's (XORWOW), so a seed reproduces runs on one kind of node only."""

    _next_id = 0

    def __init__(self, seed: int | None = None):
        self._conn = get_connection()
        Generator._next_id += 1
        self._gid = Generator._next_id
        self._conn.enqueue("gen_new", [], [self._gid, None if seed is None else int(seed)])

    def _draw(self, op: str, args: list, shape: tuple, dtype: Any) -> ndarray:
        return new_op(self._conn, op, [self._gid, *args], None, (shape, np.dtype(dtype)))

    def random(self, size: Any = None, dtype: Any = np.float64) -> ndarray:
        """Uniform [0, 1) (float32 or float64)."""
        s = _size(size)
        return self._draw("gen_random", [s, {"d": dtype_name(dtype)}], _shape_of(s), dtype)

    def standard_normal(self, size: Any = None, dtype: Any = np.float64) -> ndarray:
        s = _size(size)
        return self._draw("gen_standard_normal", [s, {"d": dtype_name(dtype)}], _shape_of(s), dtype)

    def normal(self, loc: float = 0.0, scale: float = 1.0, size: Any = None) -> ndarray:
        s = _size(size)
        return self._draw("gen_normal", [float(loc), float(scale), s], _shape_of(s), np.float64)

    def uniform(self, low: float = 0.0, high: float = 1.0, size: Any = None) -> ndarray:
        s = _size(size)
        return self._draw("gen_uniform", [float(low), float(high), s], _shape_of(s), np.float64)

    def integers(self, low: int, high: int | None = None, size: Any = None, dtype: Any = np.int64) -> ndarray:
        """Integers in [low, high) (or [0, low))."""
        s = _size(size)
        return self._draw("gen_integers", [int(low), None if high is None else int(high), s,
                                           {"d": dtype_name(dtype)}], _shape_of(s), dtype)


def default_rng(seed: int | None = None) -> Generator:
    """A new :class:`Generator` seeded with `seed` (an int in [0, 2**64), or None for entropy)."""
    return Generator(seed)
