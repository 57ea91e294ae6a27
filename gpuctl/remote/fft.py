"""``gpuctl.remote.fft``: ``cupy.fft`` run by the lease's worker (cuFFT through cupy.fft on GPU
nodes, numpy.fft on simulated ones). float32/complex64 input gives complex64 (as CuPy and NumPy 2
do); other input complex128. Shapes are inferred here for the 1-D transforms and for the n-D
ones without ``s``; with ``s`` the shape is asked from the worker when needed."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuctl.remote import _infer
from gpuctl.remote._api import _asarray, _axis, _call, _norm_tuple, _probe

Unknown = _infer.Unknown
_NORMS = (None, "backward", "ortho", "forward")


def _check_norm(norm: Any) -> None:
    if norm not in _NORMS:
        raise ValueError(f'Invalid norm value {norm}; should be "backward", "ortho" or "forward".')


def _one(name: str, a: Any, n: Any, axis: int, norm: Any) -> Any:
    _check_norm(norm)
    a = _asarray(a)
    inferred = Unknown
    if a._shape is not None and a._dtype is not None:
        if not a._shape:
            raise IndexError("tuple index out of range")
        ax = _axis(axis, len(a._shape))
        length = a._shape[ax] if n is None else int(n)
        if length < 1 and not (name == "irfft" and n is None):
            raise ValueError(f"Invalid number of FFT data points ({length}) specified.")
        out = {"fft": length, "ifft": length, "rfft": length // 2 + 1,
               "irfft": (2 * (a._shape[ax] - 1)) if n is None else int(n)}[name]
        dt = _probe(lambda x: getattr(np.fft, name)(x, n=2), a._dtype)
        shape = a._shape[:ax] + (out,) + a._shape[ax + 1:]
        inferred = (shape, dt) if dt is not None else Unknown
    kw: dict[str, Any] = {}
    if n is not None:
        kw["n"] = int(n)
    if axis != -1:
        kw["axis"] = int(axis)
    if norm is not None:
        kw["norm"] = norm
    return _call(f"fft_{name}", [a], [], kw or None, inferred)


def fft(a: Any, n: int | None = None, axis: int = -1, norm: str | None = None) -> Any:
    return _one("fft", a, n, axis, norm)


def ifft(a: Any, n: int | None = None, axis: int = -1, norm: str | None = None) -> Any:
    return _one("ifft", a, n, axis, norm)


def rfft(a: Any, n: int | None = None, axis: int = -1, norm: str | None = None) -> Any:
    return _one("rfft", a, n, axis, norm)


def irfft(a: Any, n: int | None = None, axis: int = -1, norm: str | None = None) -> Any:
    return _one("irfft", a, n, axis, norm)


def _many(name: str, a: Any, s: Any, axes: Any, norm: Any) -> Any:
    _check_norm(norm)
    a = _asarray(a)
    s, axes = _norm_tuple(s), _norm_tuple(axes)
    inferred = Unknown
    if s is None and a._shape is not None and a._dtype is not None:
        nd = len(a._shape)
        ax = axes if axes is not None else (tuple(range(nd)) if name.endswith("n") else (-2, -1))
        for x in ax:
            _axis(x, nd)
        shape = list(a._shape)
        last = ax[-1] % nd if ax else None
        if name == "rfftn" and last is not None:
            shape[last] = shape[last] // 2 + 1
        elif name == "irfftn" and last is not None:
            shape[last] = 2 * (shape[last] - 1)
        base = name.replace("2", "n")
        dt = _probe(lambda x: getattr(np.fft, base)(x, s=(2,), axes=(0,)), a._dtype)
        inferred = (tuple(shape), dt) if dt is not None else Unknown
    kw: dict[str, Any] = {}
    if s is not None:
        kw["s"] = s
    if axes is not None:
        kw["axes"] = axes
    elif name in ("fft2", "ifft2"):
        pass
    if norm is not None:
        kw["norm"] = norm
    return _call(f"fft_{name}", [a], [], kw or None, inferred)


def fft2(a: Any, s: Any = None, axes: Any = (-2, -1), norm: str | None = None) -> Any:
    return _many("fft2", a, s, axes, norm)


def ifft2(a: Any, s: Any = None, axes: Any = (-2, -1), norm: str | None = None) -> Any:
    return _many("ifft2", a, s, axes, norm)


def fftn(a: Any, s: Any = None, axes: Any = None, norm: str | None = None) -> Any:
    return _many("fftn", a, s, axes, norm)


def ifftn(a: Any, s: Any = None, axes: Any = None, norm: str | None = None) -> Any:
    return _many("ifftn", a, s, axes, norm)


def rfftn(a: Any, s: Any = None, axes: Any = None, norm: str | None = None) -> Any:
    return _many("rfftn", a, s, axes, norm)


def irfftn(a: Any, s: Any = None, axes: Any = None, norm: str | None = None) -> Any:
    return _many("irfftn", a, s, axes, norm)


def fftfreq(n: int, d: float = 1.0) -> Any:
    from gpuctl.remote._connection import get_connection
    from gpuctl.remote._ndarray import new_op

    if int(n) < 1:
        raise ValueError(f"n = {n} should be a positive integer")
    return new_op(get_connection(), "fft_fftfreq", [int(n), float(d)], None, ((int(n),), np.dtype(np.float64)))


def rfftfreq(n: int, d: float = 1.0) -> Any:
    from gpuctl.remote._connection import get_connection
    from gpuctl.remote._ndarray import new_op

    if int(n) < 1:
        raise ValueError(f"n = {n} should be a positive integer")
    return new_op(get_connection(), "fft_rfftfreq", [int(n), float(d)], None,
                  ((int(n) // 2 + 1,), np.dtype(np.float64)))


def fftshift(x: Any, axes: Any = None) -> Any:
    a = _asarray(x)
    ax = _norm_tuple(axes)
    return _call("fft_fftshift", [a], [], {"axes": ax} if ax is not None else None, (a._shape, a._dtype))


def ifftshift(x: Any, axes: Any = None) -> Any:
    a = _asarray(x)
    ax = _norm_tuple(axes)
    return _call("fft_ifftshift", [a], [], {"axes": ax} if ax is not None else None, (a._shape, a._dtype))
