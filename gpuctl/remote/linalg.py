"""``gpuctl.remote.linalg``: ``cupy.linalg`` run by the lease's worker (cupy.linalg on GPU nodes,
numpy.linalg on simulated ones).

Shapes and dtypes are inferred here, and the errors CuPy raises at the call (fewer than 2
dimensions, a non-square matrix where one is needed, shapes that do not align) raise here at the
call as ``numpy.linalg.LinAlgError`` / ValueError (cupy.linalg.LinAlgError is numpy's). A
singular matrix is only seen by the worker: numpy.linalg raises LinAlgError at the next
synchronization, naming the op; CuPy (like cuSOLVER) does not check by default and gives inf/nan.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from gpuctl.remote import _infer
from gpuctl.remote._api import _asarray, _call, _call_n, _norm_tuple, _probe

LinAlgError = np.linalg.LinAlgError
Unknown = _infer.Unknown


def _square(a: Any, name: str) -> tuple[int, ...] | None:
    s = a._shape
    if s is None:
        return None
    if len(s) < 2:
        raise LinAlgError(f"{len(s)}-dimensional array given. Array must be at least two-dimensional")
    if s[-1] != s[-2]:
        raise LinAlgError("Last 2 dimensions of the array must be square")
    return s


def _float_dtype(a: Any, fn: Any = None) -> np.dtype | None:
    if a._dtype is None:
        return None
    return _probe(lambda x: (fn or np.linalg.inv)(x.reshape(1, 1)), a._dtype)


class SVDResult(NamedTuple):
    U: Any
    S: Any
    Vh: Any


class QRResult(NamedTuple):
    Q: Any
    R: Any


class EighResult(NamedTuple):
    eigenvalues: Any
    eigenvectors: Any


class SlogdetResult(NamedTuple):
    sign: Any
    logabsdet: Any


def norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Any:
    """numpy.linalg.norm as a 0-d (or reduced) array."""
    a = _asarray(x)
    ax = _norm_tuple(axis)
    inferred = Unknown
    if a._shape is not None and a._dtype is not None:
        _infer.check_axes(ax, len(a._shape))
        red = _infer.reduction("sum", a, ax, keepdims)
        dt = _probe(lambda v: np.linalg.norm(v), a._dtype)
        if red[0] is not None and dt is not None:
            inferred = (red[0], dt)
    kw: dict[str, Any] = {}
    if ax is not None:
        kw["axis"] = ax
    if keepdims:
        kw["keepdims"] = True
    extra = [ord] if ord is not None else []
    if ord is not None and not isinstance(ord, (int, float, str)):
        raise ValueError(f"Invalid norm order {ord!r}")
    return _call("linalg_norm", [a], extra, kw or None, inferred)


def solve(a: Any, b: Any) -> Any:
    """numpy.linalg.solve (b a vector or a stack of matrices)."""
    a, b = _asarray(a), _asarray(b)
    s = _square(a, "solve")
    inferred = Unknown
    if s is not None and b._shape is not None:
        n = s[-1]
        vec = len(b._shape) == 1
        if (b._shape[0] if vec else b._shape[-2]) != n:
            raise ValueError(f"solve: Input operand 1 has a mismatch in its core dimension 0 (size "
                             f"{b._shape[0] if vec else b._shape[-2]} is different from {n})")
        dt = _probe(lambda x, y: np.linalg.solve(x.reshape(1, 1), y), a._dtype, b._dtype) if a._dtype and b._dtype else None
        shape = b._shape if vec else np.broadcast_shapes(s[:-2], b._shape[:-2]) + b._shape[-2:]
        inferred = (shape, dt) if dt is not None else Unknown
    return _call("linalg_solve", [a, b], [], None, inferred)


def inv(a: Any) -> Any:
    a = _asarray(a)
    s = _square(a, "inv")
    return _call("linalg_inv", [a], [], None, (s, _float_dtype(a)) if s is not None else Unknown)


def pinv(a: Any) -> Any:
    a = _asarray(a)
    s = a._shape
    if s is not None and len(s) < 2:
        raise LinAlgError(f"{len(s)}-dimensional array given. Array must be at least two-dimensional")
    shape = s[:-2] + (s[-1], s[-2]) if s is not None else None
    return _call("linalg_pinv", [a], [], None, (shape, _float_dtype(a, np.linalg.pinv)) if shape else Unknown)


def det(a: Any) -> Any:
    a = _asarray(a)
    s = _square(a, "det")
    return _call("linalg_det", [a], [], None, (s[:-2], _float_dtype(a, np.linalg.det)) if s is not None else Unknown)


def slogdet(a: Any) -> SlogdetResult:
    a = _asarray(a)
    s = _square(a, "slogdet")
    if s is not None and a._dtype is not None:
        r = np.linalg.slogdet(np.ones((1, 1), a._dtype))
        inferred = [(s[:-2], np.asarray(r[0]).dtype), (s[:-2], np.asarray(r[1]).dtype)]
    else:
        inferred = [Unknown, Unknown]
    return SlogdetResult(*_call_n("linalg_slogdet", 2, [a], [], None, inferred))


def cholesky(a: Any) -> Any:
    """numpy.linalg.cholesky (lower triangular). A matrix that is not positive definite: numpy's
    LinAlgError at the next synchronization (CuPy gives nan without checking)."""
    a = _asarray(a)
    s = _square(a, "cholesky")
    return _call("linalg_cholesky", [a], [], None, (s, _float_dtype(a, np.linalg.cholesky)) if s is not None else Unknown)


def qr(a: Any, mode: str = "reduced") -> Any:
    """numpy.linalg.qr for modes reduced, complete, r."""
    if mode not in ("reduced", "complete", "r"):
        raise ValueError(f"Unrecognized mode '{mode}'")
    a = _asarray(a)
    s = a._shape
    if s is not None and len(s) < 2:
        raise LinAlgError(f"{len(s)}-dimensional array given. Array must be at least two-dimensional")
    dt = _float_dtype(a, lambda x: np.linalg.qr(x)[0])
    if s is not None:
        m, n = s[-2], s[-1]
        k = min(m, n)
        q = s[:-2] + ((m, m) if mode == "complete" else (m, k))
        r = s[:-2] + ((m, n) if mode == "complete" else (k, n))
    if mode == "r":
        return _call("linalg_qr", [a], [mode], None, (r, dt) if s is not None else Unknown)
    inferred = [(q, dt), (r, dt)] if s is not None else [Unknown, Unknown]
    return QRResult(*_call_n("linalg_qr", 2, [a], [mode], None, inferred))


def svd(a: Any, full_matrices: bool = True, compute_uv: bool = True) -> Any:
    """numpy.linalg.svd: (U, S, Vh), or S alone with compute_uv=False."""
    a = _asarray(a)
    s = a._shape
    if s is not None and len(s) < 2:
        raise LinAlgError(f"{len(s)}-dimensional array given. Array must be at least two-dimensional")
    dt = _float_dtype(a, lambda x: np.linalg.svd(x)[0])
    sdt = _float_dtype(a, lambda x: np.linalg.svd(x)[1])
    kw = {"full_matrices": bool(full_matrices), "compute_uv": bool(compute_uv)}
    if s is not None:
        m, n = s[-2], s[-1]
        k = min(m, n)
        b = s[:-2]
        shapes = [b + ((m, m) if full_matrices else (m, k)), b + (k,), b + ((n, n) if full_matrices else (k, n))]
    if not compute_uv:
        return _call("linalg_svd", [a], [], kw, (shapes[1], sdt) if s is not None else Unknown)
    inferred = [(shapes[0], dt), (shapes[1], sdt), (shapes[2], dt)] if s is not None else [Unknown] * 3
    return SVDResult(*_call_n("linalg_svd", 3, [a], [], kw, inferred))


def eigh(a: Any, UPLO: str = "L") -> EighResult:
    """numpy.linalg.eigh: (eigenvalues ascending, eigenvectors)."""
    if UPLO not in ("L", "U"):
        raise ValueError("UPLO argument must be 'L' or 'U'")
    a = _asarray(a)
    s = _square(a, "eigh")
    if s is not None and a._dtype is not None:
        w, v = np.linalg.eigh(np.ones((1, 1), a._dtype))
        inferred = [(s[:-1], w.dtype), (s, v.dtype)]
    else:
        inferred = [Unknown, Unknown]
    return EighResult(*_call_n("linalg_eigh", 2, [a], [UPLO] if UPLO != "L" else [], None, inferred))


def eigvalsh(a: Any, UPLO: str = "L") -> Any:
    a = _asarray(a)
    s = _square(a, "eigvalsh")
    dt = _float_dtype(a, np.linalg.eigvalsh)
    return _call("linalg_eigvalsh", [a], [UPLO] if UPLO != "L" else [], None,
                 (s[:-1], dt) if s is not None else Unknown)


def matrix_rank(A: Any) -> Any:
    a = _asarray(A)
    shape = a._shape[:-2] if a._shape is not None and len(a._shape) >= 2 else (() if a._shape is not None else None)
    return _call("linalg_matrix_rank", [a], [], None, (shape, np.dtype(np.int64)) if shape is not None else Unknown)
