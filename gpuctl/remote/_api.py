"""CuPy's everyday functions beyond creation, ufuncs and reductions (issue 14): shape and order
(pad, tile, repeat, split, flip, roll, moveaxis, broadcast_to), selection (take, nonzero,
searchsorted, unique), matrices (diag, trace, tril, triu, meshgrid), statistics (diff, cumprod,
percentile, histogram, bincount), comparisons (allclose, array_equal), complex parts, rounding,
nan_to_num, astype, save/load.

Each runs on the worker as one allow-listed op (gpuctl.datapath.ops) with NumPy's semantics
(CuPy's are the same for these names). Shapes and dtypes are inferred here where they do not
depend on data, and shape/axis errors raise at the call, as CuPy raises them. What differs from
CuPy is said in each docstring; data-dependent shapes (nonzero, unique, bincount, a boolean mask)
cost one round trip when asked.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from gpuctl.datapath.ops import _pad_widths, _tile_shape
from gpuctl.remote import _infer
from gpuctl.remote._ndarray import (
    _Temps,
    conn_of,
    dtype_name,
    enc,
    ndarray,
    new_op,
    new_ops,
    operand,
)

Unknown = _infer.Unknown


def _asarray(a: Any) -> ndarray:
    from gpuctl.remote import asarray

    return asarray(a)


def _call(name: str, arrays: Sequence[Any], extra: Sequence[Any] = (), kwargs: dict | None = None,
          inferred: tuple = Unknown) -> ndarray:
    conn = conn_of(*arrays)
    temps = _Temps()
    args = [operand(conn, a, temps) for a in arrays] + [enc(conn, v, temps) for v in extra]
    kw = {k: enc(conn, v, temps) for k, v in (kwargs or {}).items()} or None
    return new_op(conn, name, args, kw, inferred)


def _call_n(name: str, n: int, arrays: Sequence[Any], extra: Sequence[Any] = (), kwargs: dict | None = None,
            inferred: Sequence[tuple] | None = None) -> tuple[ndarray, ...]:
    conn = conn_of(*arrays)
    temps = _Temps()
    args = [operand(conn, a, temps) for a in arrays] + [enc(conn, v, temps) for v in extra]
    kw = {k: enc(conn, v, temps) for k, v in (kwargs or {}).items()} or None
    return new_ops(conn, name, n, args, kw, inferred or [Unknown] * n)


def _axis(axis: Any, ndim: int) -> int:
    """`axis` normalized against `ndim`; numpy's AxisError (an IndexError and ValueError) when out of range."""
    try:
        i = operator.index(axis)
    except TypeError:
        raise TypeError(f"an integer is required for the axis, got {axis!r}") from None
    if not -ndim <= i < ndim:
        raise np.exceptions.AxisError(i, ndim)
    return i % ndim


def _standin(a: ndarray) -> np.ndarray | None:
    """A zero-stride NumPy array of `a`'s shape and dtype (no memory): views computed on it give the
    worker's result shape, and NumPy's errors on it are the worker's errors, raised at the call."""
    if a._shape is None or a._dtype is None:
        return None
    return np.lib.stride_tricks.as_strided(np.zeros(1, a._dtype), shape=a._shape, strides=(0,) * len(a._shape))


def _view_infer(a: ndarray, fn: Any) -> tuple:
    s = _standin(a)
    if s is None:
        return Unknown
    r = fn(s)  # raises numpy's error at the call
    return r.shape, r.dtype


def _probe(fn: Any, *dtypes: Any) -> np.dtype | None:
    try:
        with np.errstate(all="ignore"):
            return np.asarray(fn(*[np.ones(1, d) for d in dtypes])).dtype
    except Exception:  # noqa: BLE001 - the worker reports the real error
        return None


# -- dtype information -------------------------------------------------------------------------
finfo = np.finfo
iinfo = np.iinfo


def astype(x: Any, dtype: Any, /, *, copy: bool = True) -> ndarray:
    """Array API ``astype(x, dtype, copy=True)``: ``x.astype(dtype, copy=copy)``."""
    return _asarray(x).astype(dtype, copy=copy)


# -- shape and order ---------------------------------------------------------------------------
class _Dims:
    __slots__ = ("ndim", "shape")

    def __init__(self, shape: tuple[int, ...]):
        self.shape, self.ndim = shape, len(shape)


def _norm_tuple(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_norm_tuple(x) for x in v)
    if isinstance(v, np.integer):
        return int(v)
    return v


def pad(array: Any, pad_width: Any, mode: str = "constant", constant_values: Any = 0) -> ndarray:
    """numpy.pad for modes constant, edge, reflect, symmetric, wrap (CuPy also has linear_ramp,
    maximum, mean, minimum: not supported here); constant_values is one scalar."""
    a = _asarray(array)
    pw = _norm_tuple(pad_width)
    inferred = Unknown
    if a._shape is not None:
        pairs = _pad_widths(_Dims(a._shape), pw)
        inferred = (tuple(d + b + e for d, (b, e) in zip(a._shape, pairs)), a._dtype)
    if mode not in ("constant", "edge", "reflect", "symmetric", "wrap"):
        raise ValueError(f"pad: mode {mode!r} is not supported by gpuctl.remote (constant, edge, reflect, "
                         "symmetric, wrap)")
    return _call("pad", [a], [pw, mode], {"constant_values": constant_values} if mode == "constant" else None,
                 inferred)


def tile(A: Any, reps: Any) -> ndarray:
    """numpy.tile."""
    a = _asarray(A)
    reps = _norm_tuple(reps)
    inferred = (_tile_shape(_Dims(a._shape), reps), a._dtype) if a._shape is not None else Unknown
    return _call("tile", [a], [reps], None, inferred)


def repeat(a: Any, repeats: Any, axis: int | None = None) -> ndarray:
    """numpy.repeat; `repeats` an int or a sequence/array of ints."""
    a = _asarray(a)
    inferred = Unknown
    if isinstance(repeats, (int, np.integer)) and a._shape is not None:
        r = int(repeats)
        if r < 0:
            raise ValueError("repeat: negative dimensions are not allowed")
        if axis is None:
            inferred = ((math.prod(a._shape) * r,), a._dtype)
        else:
            ax = _axis(axis, len(a._shape))
            inferred = (a._shape[:ax] + (a._shape[ax] * r,) + a._shape[ax + 1:], a._dtype)
        repeats = r
    elif isinstance(repeats, (list, tuple)):
        repeats = np.asarray(repeats, dtype=np.int64)
    return _call("repeat", [a, repeats], [], {"axis": axis} if axis is not None else None, inferred)


def split(ary: Any, indices_or_sections: Any, axis: int = 0) -> list[ndarray]:
    """numpy.split: views of `ary` (basic slicing on the worker, no copies)."""
    return _split(ary, indices_or_sections, axis, strict=True)


def array_split(ary: Any, indices_or_sections: Any, axis: int = 0) -> list[ndarray]:
    """numpy.array_split: like split, sections may differ in size by one."""
    return _split(ary, indices_or_sections, axis, strict=False)


def _split(ary: Any, ios: Any, axis: int, strict: bool) -> list[ndarray]:
    a = _asarray(ary)
    ax = _axis(axis, a.ndim)
    n = a.shape[ax]
    if isinstance(ios, (int, np.integer)):
        k = int(ios)
        if k <= 0:
            raise ValueError("number sections must be larger than 0.")
        if strict and n % k:
            raise ValueError("array split does not result in an equal division")
        each, extra = divmod(n, k)
        bounds = [0]
        for i in range(k):
            bounds.append(bounds[-1] + each + (1 if i < extra else 0))
    else:
        bounds = [0, *[int(i) for i in ios], n]
    out = []
    for lo, hi in itertools.pairwise(bounds):
        key = (slice(None),) * ax + (slice(lo, hi),)
        out.append(a[key])
    return out


def flip(m: Any, axis: Any = None) -> ndarray:
    """numpy.flip (a view)."""
    a = _asarray(m)
    ax = _norm_tuple(axis)
    return _call("flip", [a], [], {"axis": ax} if ax is not None else None,
                 _view_infer(a, lambda s: np.flip(s, ax)))


def fliplr(m: Any) -> ndarray:
    return flip(m, 1)


def flipud(m: Any) -> ndarray:
    return flip(m, 0)


def roll(a: Any, shift: Any, axis: Any = None) -> ndarray:
    """numpy.roll."""
    a = _asarray(a)
    sh, ax = _norm_tuple(shift), _norm_tuple(axis)
    inferred = _view_infer(a, lambda s: np.flip(s, ax) if ax is not None else s)
    return _call("roll", [a], [sh], {"axis": ax} if ax is not None else None, inferred)


def rot90(m: Any, k: int = 1, axes: tuple[int, int] = (0, 1)) -> ndarray:
    """numpy.rot90 (a view)."""
    a = _asarray(m)
    axes = _norm_tuple(axes)
    return _call("rot90", [a], [int(k), axes], None, _view_infer(a, lambda s: np.rot90(s, k, axes)))


def moveaxis(a: Any, source: Any, destination: Any) -> ndarray:
    """numpy.moveaxis (a view)."""
    a = _asarray(a)
    src, dst = _norm_tuple(source), _norm_tuple(destination)
    return _call("moveaxis", [a], [src, dst], None, _view_infer(a, lambda s: np.moveaxis(s, src, dst)))


def broadcast_to(array: Any, shape: Any) -> ndarray:
    """numpy.broadcast_to (a read-only view in NumPy; writable here as in CuPy)."""
    a = _asarray(array)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    return _call("broadcast_to", [a], [shape], None, _view_infer(a, lambda s: np.broadcast_to(s, shape)))


def broadcast_arrays(*args: Any) -> list[ndarray]:
    """numpy.broadcast_arrays: each argument broadcast to the common shape (views)."""
    arrays = [_asarray(a) for a in args]
    shape = np.broadcast_shapes(*[a.shape for a in arrays])
    return [broadcast_to(a, shape) for a in arrays]


def diagonal(a: Any, offset: int = 0, axis1: int = 0, axis2: int = 1) -> ndarray:
    a = _asarray(a)
    return _call("diagonal", [a], [int(offset), int(axis1), int(axis2)], None,
                 _view_infer(a, lambda s: np.diagonal(s, offset, axis1, axis2)))


# -- selection ---------------------------------------------------------------------------------
def take(a: Any, indices: Any, axis: int | None = None) -> ndarray:
    """numpy.take (indices: an int, a list or an integer array; out-of-range indices raise at the
    next synchronization, where CuPy wraps them)."""
    a = _asarray(a)
    scalar = isinstance(indices, (int, np.integer))
    ind = int(indices) if scalar else (np.asarray(indices, dtype=np.int64) if isinstance(indices, (list, tuple))
                                       else indices)
    ishape = () if scalar else _infer.shape_of(np.asarray(ind) if isinstance(ind, list) else ind)
    inferred = Unknown
    if a._shape is not None and ishape is not None:
        if axis is None:
            inferred = (tuple(ishape), a._dtype)
        else:
            ax = _axis(axis, len(a._shape))
            inferred = (a._shape[:ax] + tuple(ishape) + a._shape[ax + 1:], a._dtype)
    return _call("take", [a, ind], [], {"axis": axis} if axis is not None else None, inferred)


def take_along_axis(arr: Any, indices: Any, axis: int | None) -> ndarray:
    """numpy.take_along_axis."""
    a, ind = _asarray(arr), _asarray(indices)
    inferred = Unknown
    if a._shape is not None and ind._shape is not None:
        if axis is None:
            inferred = (ind._shape, a._dtype)
        else:
            if len(ind._shape) != len(a._shape):
                raise ValueError("`indices` and `arr` must have the same number of dimensions")
            ax = _axis(axis, len(a._shape))
            try:
                sa = list(a._shape)
                sa[ax] = 1
                si = list(ind._shape)
                si[ax] = 1
                b = np.broadcast_shapes(tuple(sa), tuple(si))
            except ValueError as e:
                raise ValueError(str(e)) from None
            inferred = (b[:ax] + (ind._shape[ax],) + b[ax + 1:], a._dtype)
    return _call("take_along_axis", [a, ind], [axis], None, inferred)


def nonzero(a: Any) -> tuple[ndarray, ...]:
    """numpy.nonzero: one int64 index array per dimension (their length depends on data: asking
    `.shape` is a round trip). Arrays of more than 8 dimensions are refused."""
    a = _asarray(a)
    n = a.ndim
    if n == 0:
        raise ValueError("Calling nonzero on 0d arrays is not allowed. Use np.atleast_1d(scalar).nonzero() instead.")
    return _call_n("nonzero", n, [a], inferred=[(None, np.dtype(np.int64))] * n)


def argwhere(a: Any) -> ndarray:
    a = _asarray(a)
    return _call("argwhere", [a], inferred=(None, np.dtype(np.int64)))


def flatnonzero(a: Any) -> ndarray:
    a = _asarray(a)
    return _call("flatnonzero", [a], inferred=(None, np.dtype(np.int64)))


def count_nonzero(a: Any, axis: Any = None, *, keepdims: bool = False) -> ndarray:
    """numpy.count_nonzero as a 0-d (or reduced) int64 array, as CuPy returns it."""
    a = _asarray(a)
    ax = _norm_tuple(axis)
    inferred = _infer.reduction("count_nonzero", a, ax, keepdims) if a._shape is not None else Unknown
    if inferred[0] is None and a._shape is not None and ax is not None:
        _infer.check_axes(ax, len(a._shape))
    kw: dict[str, Any] = {}
    if keepdims:
        raise NotImplementedError("count_nonzero: keepdims=True is not supported by gpuctl.remote")
    return _call("count_nonzero", [a], [ax], kw or None, (inferred[0], np.dtype(np.int64)))


def searchsorted(a: Any, v: Any, side: str = "left", sorter: Any = None) -> ndarray:
    """numpy.searchsorted (no `sorter`)."""
    if sorter is not None:
        raise NotImplementedError("searchsorted: sorter= is not supported by gpuctl.remote")
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right' (got {side!r})")
    a = _asarray(a)
    vshape = _infer.shape_of(np.asarray(v) if isinstance(v, list) else v)
    return _call("searchsorted", [a, v], [side], None, (vshape, np.dtype(np.int64)) if vshape is not None else Unknown)


class UniqueAllResult(NamedTuple):
    values: ndarray
    indices: ndarray
    inverse_indices: ndarray
    counts: ndarray


class UniqueCountsResult(NamedTuple):
    values: ndarray
    counts: ndarray


class UniqueInverseResult(NamedTuple):
    values: ndarray
    inverse_indices: ndarray


def unique(ar: Any, return_index: bool = False, return_inverse: bool = False, return_counts: bool = False,
           axis: int | None = None, *, equal_nan: bool = True) -> Any:
    """numpy.unique of the flattened array (no `axis`): sorted values, and as asked the first
    indices, the inverse and the counts (int64). Lengths depend on data (`.shape` is a round trip)."""
    if axis is not None:
        raise NotImplementedError("unique: axis= is not supported by gpuctl.remote")
    a = _asarray(ar)
    n = 1 + bool(return_index) + bool(return_inverse) + bool(return_counts)
    kw = {k: True for k, v in (("return_index", return_index), ("return_inverse", return_inverse),
                               ("return_counts", return_counts)) if v}
    inferred = [(None, a._dtype)] + [(None, np.dtype(np.int64))] * (n - 1)
    if return_inverse and a._shape is not None:
        inv = n - 1 - bool(return_counts)
        inferred[inv] = (a._shape, np.dtype(np.int64))  # NumPy 2: the input's shape
    if n == 1:
        return _call("unique", [a], [], None, inferred[0])
    return _call_n("unique", n, [a], [], kw, inferred)


def unique_values(x: Any) -> ndarray:
    """Array API unique_values: the distinct values, sorted (as CuPy; NumPy 2.3+ may leave them
    unordered, which the array API allows)."""
    return unique(x)


def unique_counts(x: Any) -> UniqueCountsResult:
    """Array API unique_counts: (values, counts)."""
    return UniqueCountsResult(*unique(x, return_counts=True))


def unique_inverse(x: Any) -> UniqueInverseResult:
    """Array API unique_inverse: (values, inverse_indices) with inverse_indices of x's shape."""
    values, inv = unique(x, return_inverse=True)
    a = _asarray(x)
    if inv.shape != a.shape:
        inv = inv.reshape(a.shape)
    return UniqueInverseResult(values, inv)


def unique_all(x: Any) -> UniqueAllResult:
    """Array API unique_all: (values, indices, inverse_indices, counts)."""
    values, idx, inv, counts = unique(x, return_index=True, return_inverse=True, return_counts=True)
    a = _asarray(x)
    if inv.shape != a.shape:
        inv = inv.reshape(a.shape)
    return UniqueAllResult(values, idx, inv, counts)


# -- matrices ----------------------------------------------------------------------------------
def diag(v: Any, k: int = 0) -> ndarray:
    """numpy.diag: a 2-D array from a 1-D diagonal, or a 2-D array's k-th diagonal (a copy here;
    CuPy gives a view for 2-D input)."""
    a = _asarray(v)
    k = int(k)
    inferred = Unknown
    if a._shape is not None:
        if len(a._shape) == 1:
            n = a._shape[0] + abs(k)
            inferred = ((n, n), a._dtype)
        elif len(a._shape) == 2:
            inferred = _view_infer(a, lambda s: np.diagonal(s, k))
        else:
            raise ValueError("Input must be 1- or 2-d.")
    return _call("diag", [a], [k], None, inferred)


def trace(a: Any, offset: int = 0, axis1: int = 0, axis2: int = 1, dtype: Any = None, out: Any = None) -> ndarray:
    """numpy.trace (no `out`)."""
    if out is not None:
        raise TypeError("trace: out= is not supported by gpuctl.remote")
    a = _asarray(a)
    inferred = Unknown
    if a._shape is not None:
        d = _standin(a)
        shape = np.diagonal(d, offset, axis1, axis2).shape[:-1]
        dt = _probe(lambda x: np.trace(x.reshape(1, 1), dtype=dtype), a._dtype)
        inferred = (shape, dt) if dt is not None else Unknown
    return _call("trace", [a], [int(offset), int(axis1), int(axis2)],
                 {"dtype": np.dtype(dtype_name(dtype))} if dtype is not None else None, inferred)


def tril(m: Any, k: int = 0) -> ndarray:
    a = _asarray(m)
    if a._shape is not None and len(a._shape) < 2:
        raise ValueError("tril: input must be at least 2-d (1-d input is not supported by gpuctl.remote)")
    return _call("tril", [a], [int(k)], None, (a._shape, a._dtype))


def triu(m: Any, k: int = 0) -> ndarray:
    a = _asarray(m)
    if a._shape is not None and len(a._shape) < 2:
        raise ValueError("triu: input must be at least 2-d (1-d input is not supported by gpuctl.remote)")
    return _call("triu", [a], [int(k)], None, (a._shape, a._dtype))


def meshgrid(*xi: Any, indexing: str = "xy", sparse: bool = False, copy: bool = True) -> list[ndarray]:
    """numpy.meshgrid (1 to 8 inputs; `sparse=True` is not supported)."""
    if sparse:
        raise NotImplementedError("meshgrid: sparse=True is not supported by gpuctl.remote")
    if indexing not in ("xy", "ij"):
        raise ValueError("Valid values for `indexing` are 'xy' and 'ij'.")
    arrays = [_asarray(x) for x in xi]
    if not arrays:
        return []
    sizes = [a.size for a in arrays]
    shape = list(sizes)
    if indexing == "xy" and len(shape) > 1:
        shape[0], shape[1] = shape[1], shape[0]
    inferred = [(tuple(shape), a._dtype) for a in arrays]
    return list(_call_n("meshgrid", len(arrays), arrays, [], {"indexing": indexing} if indexing != "xy" else None,
                        inferred))


# -- statistics --------------------------------------------------------------------------------
def diff(a: Any, n: int = 1, axis: int = -1) -> ndarray:
    """numpy.diff (no prepend/append)."""
    a = _asarray(a)
    n = int(n)
    if n < 0:
        raise ValueError(f"order must be non-negative but got {n}")
    inferred = Unknown
    if a._shape is not None:
        if not a._shape:
            raise ValueError("diff requires input that is at least one dimensional")
        ax = _axis(axis, len(a._shape))
        shape = list(a._shape)
        shape[ax] = max(0, shape[ax] - n)
        inferred = (tuple(shape), a._dtype)  # bool stays bool (not_equal), others keep their dtype
    return _call("diff", [a], [n, int(axis)], None, inferred)


def cumprod(a: Any, axis: int | None = None, dtype: Any = None, out: Any = None) -> ndarray:
    return _asarray(a).cumprod(axis, dtype, out)


def percentile(a: Any, q: Any, axis: Any = None, out: Any = None, overwrite_input: bool = False,
               method: str = "linear", keepdims: bool = False) -> ndarray:
    """numpy.percentile (methods linear, lower, higher, midpoint, nearest; no `out`)."""
    if out is not None:
        raise TypeError("percentile: out= is not supported by gpuctl.remote")
    a = _asarray(a)
    qv = q if isinstance(q, ndarray) else np.asarray(q, dtype=np.float64)
    ax = _norm_tuple(axis)
    inferred = Unknown
    if a._shape is not None and (not isinstance(qv, ndarray) or qv._shape is not None):
        red = _infer.reduction("sum", a, ax, keepdims)
        if red[0] is None:
            _infer.check_axes(ax, len(a._shape))
        if isinstance(qv, ndarray) or qv.ndim:
            dt = _probe(lambda x, qq: np.percentile(x, qq * 50.0, method=method), a._dtype, qv.dtype)
        else:
            dt = _probe(lambda x: np.percentile(x, 50.0, method=method), a._dtype)
        if red[0] is not None and dt is not None:
            inferred = (tuple(qv.shape) + red[0], dt)
    qarg: Any = float(qv) if not isinstance(qv, ndarray) and qv.ndim == 0 else qv
    kw: dict[str, Any] = {}
    if ax is not None:
        kw["axis"] = ax
    if keepdims:
        kw["keepdims"] = True
    if method != "linear":
        kw["method"] = method
    return _call("percentile", [a, qarg], [], kw or None, inferred)


def histogram(x: Any, bins: Any = 10, range: Any = None, weights: Any = None, density: bool = False
              ) -> tuple[ndarray, ndarray]:
    """numpy.histogram: (counts int64, bin_edges) for an int number of bins or an array of edges
    (no weights, no density)."""
    if weights is not None or density:
        raise NotImplementedError("histogram: weights= and density= are not supported by gpuctl.remote")
    a = _asarray(x)
    if isinstance(bins, (int, np.integer)):
        nb = int(bins)
        if nb < 1:
            raise ValueError("`bins` must be positive, when an integer")
        edt = _probe(lambda v: np.histogram(v, bins=1)[1], a._dtype) if a._dtype is not None else None
        inferred = [((nb,), np.dtype(np.int64)), ((nb + 1,), edt)]
        b: Any = nb
    else:
        b = bins
        bs = _infer.shape_of(np.asarray(bins) if isinstance(bins, list) else bins)
        inferred = [((bs[0] - 1,), np.dtype(np.int64)) if bs else Unknown, Unknown]
    kw = {"range": tuple(float(v) for v in range)} if range is not None else None
    if isinstance(b, int):
        return _call_n("histogram", 2, [a], [b], kw, inferred)  # type: ignore[return-value]
    return _call_n("histogram", 2, [a, b], [], kw, inferred)  # type: ignore[return-value]


def bincount(x: Any, weights: Any = None, minlength: int = 0) -> ndarray:
    """numpy.bincount (the length depends on data: `.shape` is a round trip)."""
    a = _asarray(x)
    if a._shape is not None and len(a._shape) != 1:
        raise ValueError("object too deep for desired array" if len(a._shape) > 1 else "object of too small depth for desired array")
    kw: dict[str, Any] = {}
    arrays: list[Any] = [a]
    if minlength:
        kw["minlength"] = int(minlength)
    dt = np.dtype(np.int64)
    if weights is not None:
        w = _asarray(weights)
        kw["weights"] = w
        dt = np.dtype(np.float64) if w._dtype is None or w._dtype.kind != "c" else np.dtype(np.complex128)
    conn = conn_of(a)
    temps = _Temps()
    enc_kw = {k: enc(conn, v, temps) for k, v in kw.items()} or None
    return new_op(conn, "bincount", [operand(conn, arrays[0], temps)], enc_kw, (None, dt))


# -- comparisons -------------------------------------------------------------------------------
def allclose(a: Any, b: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> ndarray:
    """numpy.allclose as a 0-d bool array (as CuPy returns it; ``bool(...)`` synchronizes)."""
    _infer.broadcast_or_raise(_infer.shape_of(a), _infer.shape_of(b))
    kw = {"rtol": float(rtol), "atol": float(atol)}
    if equal_nan:
        kw["equal_nan"] = True
    return _call("allclose", [a, b], [], kw, ((), np.dtype(np.bool_)))


def array_equal(a1: Any, a2: Any, equal_nan: bool = False) -> ndarray:
    """numpy.array_equal as a 0-d bool array."""
    return _call("array_equal", [a1, a2], [], {"equal_nan": True} if equal_nan else None, ((), np.dtype(np.bool_)))


# -- complex parts, rounding -------------------------------------------------------------------
def real(val: Any) -> ndarray:
    """numpy.real (a view for complex input, the array itself otherwise, as in NumPy)."""
    a = _asarray(val)
    return _call("real", [a], [], None, (a._shape, _probe(np.real, a._dtype) if a._dtype is not None else None))


def imag(val: Any) -> ndarray:
    """numpy.imag (zeros for real input)."""
    a = _asarray(val)
    return _call("imag", [a], [], None, (a._shape, _probe(np.imag, a._dtype) if a._dtype is not None else None))


def conj(x: Any) -> ndarray:
    from gpuctl.remote._ndarray import ufunc

    return ufunc("conjugate", x)


conjugate = conj


def around(a: Any, decimals: int = 0, out: Any = None) -> ndarray:
    """numpy.around / round (halves to even; no `out`)."""
    if out is not None:
        raise TypeError("round: out= is not supported by gpuctl.remote")
    a = _asarray(a)
    return _call("around", [a], [int(decimals)], None, (a._shape, a._dtype))


round_ = around


def nan_to_num(x: Any, copy: bool = True, nan: float = 0.0, posinf: float | None = None,
               neginf: float | None = None) -> ndarray:
    """numpy.nan_to_num (always a new array: copy=False does not write in place here)."""
    a = _asarray(x)
    kw: dict[str, Any] = {"nan": nan}
    if posinf is not None:
        kw["posinf"] = posinf
    if neginf is not None:
        kw["neginf"] = neginf
    return _call("nan_to_num", [a], [], kw, (a._shape, a._dtype))


# -- files -------------------------------------------------------------------------------------
def save(file: Any, arr: Any, allow_pickle: bool = True) -> None:
    """numpy.save of the array fetched to the host (a synchronization point)."""
    a = _asarray(arr)
    np.save(file, a.get(), allow_pickle=False)


def load(file: Any, mmap_mode: Any = None, allow_pickle: bool = False) -> Any:
    """numpy.load, uploaded: a .npy file gives a remote array, a .npz a dict of remote arrays
    (CuPy returns an NpzFile-like object). Pickled object arrays are refused."""
    from gpuctl.remote import asarray

    data = np.load(file, mmap_mode=mmap_mode, allow_pickle=False)
    if isinstance(data, np.lib.npyio.NpzFile):
        with data:
            return {k: asarray(data[k]) for k in data.files}
    return asarray(data)


# -- compositions of the ops above and host-side dtype routines --------------------------------
result_type = np.result_type
can_cast = np.can_cast
promote_types = np.promote_types
min_scalar_type = np.min_scalar_type
issubdtype = np.issubdtype
isscalar = np.isscalar


def ndim(a: Any) -> int:
    return a.ndim if isinstance(a, ndarray) else np.ndim(a)


def shape(a: Any) -> tuple[int, ...]:
    return a.shape if isinstance(a, ndarray) else np.shape(a)


def size(a: Any, axis: int | None = None) -> int:
    if not isinstance(a, ndarray):
        return np.size(a, axis)
    return a.size if axis is None else a.shape[axis]


def copy(a: Any) -> ndarray:
    """A new array with `a`'s contents (uploads host data)."""
    return _asarray(a).copy()


def ravel(a: Any) -> ndarray:
    return _asarray(a).ravel()


def swapaxes(a: Any, axis1: int, axis2: int) -> ndarray:
    return _asarray(a).swapaxes(axis1, axis2)


def atleast_1d(*arys: Any) -> Any:
    out = [_asarray(a) if _asarray(a).ndim >= 1 else _asarray(a).reshape(1) for a in arys]
    return out[0] if len(out) == 1 else out


def atleast_2d(*arys: Any) -> Any:
    out = []
    for a in arys:
        a = _asarray(a)
        out.append(a if a.ndim >= 2 else a.reshape((1,) * (2 - a.ndim) + a.shape))
    return out[0] if len(out) == 1 else out


def atleast_3d(*arys: Any) -> Any:
    out = []
    for a in arys:
        a = _asarray(a)
        shape_ = {0: (1, 1, 1), 1: (1,) + a.shape + (1,), 2: a.shape + (1,)}.get(a.ndim, a.shape)
        out.append(a.reshape(shape_) if a.ndim < 3 else a)
    return out[0] if len(out) == 1 else out


def hstack(tup: Sequence[Any]) -> ndarray:
    from gpuctl.remote import concatenate

    arrs = atleast_1d(*tup)
    arrs = [arrs] if isinstance(arrs, ndarray) else arrs
    return concatenate(arrs, axis=0 if arrs and arrs[0].ndim == 1 else 1)


def vstack(tup: Sequence[Any]) -> ndarray:
    from gpuctl.remote import concatenate

    arrs = atleast_2d(*tup)
    return concatenate([arrs] if isinstance(arrs, ndarray) else arrs, axis=0)


def dstack(tup: Sequence[Any]) -> ndarray:
    from gpuctl.remote import concatenate

    arrs = atleast_3d(*tup)
    return concatenate([arrs] if isinstance(arrs, ndarray) else arrs, axis=2)


def column_stack(tup: Sequence[Any]) -> ndarray:
    from gpuctl.remote import concatenate

    arrs = [_asarray(a) for a in tup]
    arrs = [a.reshape(a.shape[0], 1) if a.ndim < 2 else a for a in arrs]
    return concatenate(arrs, axis=1)


def append(arr: Any, values: Any, axis: int | None = None) -> ndarray:
    from gpuctl.remote import concatenate

    a, v = _asarray(arr), _asarray(values)
    if axis is None:
        return concatenate([a.ravel(), v.ravel()], axis=0)
    return concatenate([a, v], axis=axis)


def diagflat(v: Any, k: int = 0) -> ndarray:
    return diag(_asarray(v).ravel(), k)


def tri(N: int, M: int | None = None, k: int = 0, dtype: Any = float) -> ndarray:
    """numpy.tri: ones at and below the k-th diagonal."""
    from gpuctl.remote import ones

    return tril(ones((N, N if M is None else M), dtype=dtype), k)


def logspace(start: float, stop: float, num: int = 50, endpoint: bool = True, base: float = 10.0,
             dtype: Any = None) -> ndarray:
    """numpy.logspace: base ** linspace(start, stop, num)."""
    from gpuctl.remote import linspace, power

    y = power(float(base), linspace(start, stop, num, endpoint))
    return y.astype(dtype) if dtype is not None else y


def isclose(a: Any, b: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> ndarray:
    """numpy.isclose, elementwise on the worker."""
    shape_ = _infer.broadcast_or_raise(_infer.shape_of(a), _infer.shape_of(b))
    kw = {"rtol": float(rtol), "atol": float(atol)}
    if equal_nan:
        kw["equal_nan"] = True
    return _call("isclose", [a, b], [], kw, (shape_, np.dtype(np.bool_)) if shape_ is not None else Unknown)


def vdot(a: Any, b: Any) -> ndarray:
    """numpy.vdot: the dot product of the flattened arrays, the first conjugated."""
    from gpuctl.remote import dot

    return dot(conj(_asarray(a).ravel()), _asarray(b).ravel())


# -- ndarray methods built on the functions above (attached here: _ndarray does not import this
# module, so the two stay free of an import circle) -------------------------------------------
def _method_conj(self: ndarray) -> ndarray:
    return conj(self)


ndarray.nonzero = lambda self: nonzero(self)  # type: ignore[attr-defined]
ndarray.repeat = lambda self, repeats, axis=None: repeat(self, repeats, axis)  # type: ignore[attr-defined]
ndarray.take = lambda self, indices, axis=None: take(self, indices, axis)  # type: ignore[attr-defined]
ndarray.diagonal = lambda self, offset=0, axis1=0, axis2=1: diagonal(self, offset, axis1, axis2)  # type: ignore[attr-defined]
ndarray.trace = (lambda self, offset=0, axis1=0, axis2=1, dtype=None, out=None:  # type: ignore[attr-defined]
                 trace(self, offset, axis1, axis2, dtype, out))
ndarray.round = lambda self, decimals=0, out=None: around(self, decimals, out)  # type: ignore[attr-defined]
ndarray.conj = ndarray.conjugate = _method_conj  # type: ignore[attr-defined]
ndarray.real = property(lambda self: real(self), doc="numpy.real of the array")  # type: ignore[attr-defined]
ndarray.imag = property(lambda self: imag(self), doc="numpy.imag of the array")  # type: ignore[attr-defined]
