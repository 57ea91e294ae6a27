"""Result shapes and dtypes computed on the client, so ops that return arrays need no round trip.

Each function returns ``(shape, dtype)``, or ``(None, None)`` when the answer is not known
without the worker (unknown input shape, data-dependent shape such as boolean masks, or an error
the worker will report at the next synchronization). dtypes follow NumPy 2 promotion (NEP 50),
computed by NumPy itself on one-element arrays; the worker's answer wins when they differ.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

import numpy as np

Unknown = (None, None)


def _probe_operand(x: Any) -> Any:
    dt = getattr(x, "_dtype", None)
    if dt is not None:
        return np.ones(1, dt)
    if isinstance(x, np.ndarray):
        return np.ones(1, x.dtype)
    return x


@functools.lru_cache(maxsize=4096)
def _ufunc_dtype(name: str, key: tuple) -> np.dtype | None:
    operands = [np.ones(1, k[1]) if k[0] == "a" else k[1] for k in key]
    try:
        with np.errstate(all="ignore"):
            return getattr(np, name)(*operands).dtype
    except Exception:  # noqa: BLE001 - the worker reports the real error
        return None


def _key(x: Any) -> tuple:
    dt = getattr(x, "_dtype", None)
    if dt is not None:
        return ("a", dt)
    if isinstance(x, np.ndarray):
        return ("a", x.dtype)
    if isinstance(x, bool):
        return ("s", True)
    if isinstance(x, int):
        return ("s", 1)
    if isinstance(x, float):
        return ("s", 1.0)
    if isinstance(x, complex):
        return ("s", 1j)
    return ("?", type(x).__name__)


def shape_of(x: Any) -> tuple[int, ...] | None:
    if hasattr(x, "_shape"):
        return x._shape
    if isinstance(x, np.ndarray):
        return x.shape
    return ()


def elementwise(name: str, *operands: Any) -> tuple:
    """Broadcast shape and promoted dtype of ufunc `name` over `operands`."""
    shapes = [shape_of(x) for x in operands]
    keys = tuple(_key(x) for x in operands)
    if any(s is None for s in shapes) or any(k[0] == "a" and k[1] is None for k in keys) or any(k[0] == "?" for k in keys):
        return Unknown
    try:
        shape = np.broadcast_shapes(*shapes)
    except ValueError:
        return Unknown
    dtype = _ufunc_dtype(name, keys)
    return (shape, dtype) if dtype is not None else Unknown


def where(c: Any, x: Any, y: Any) -> tuple:
    shapes = [shape_of(v) for v in (c, x, y)]
    if any(s is None for s in shapes):
        return Unknown
    try:
        shape = np.broadcast_shapes(*shapes)
        dtype = np.where(True, _probe_operand(x), _probe_operand(y)).dtype
    except (ValueError, TypeError):
        return Unknown
    return shape, dtype


def normalize_axis(axis: Any, ndim: int) -> tuple[int, ...] | None:
    if axis is None:
        return tuple(range(ndim))
    axes = axis if isinstance(axis, tuple) else (axis,)
    out = []
    for a in axes:
        if not isinstance(a, int) or not -ndim <= a < max(ndim, 1) or (ndim == 0 and a not in (0, -1)):
            return None
        out.append(a % ndim if ndim else 0)
    return tuple(out) if len(set(out)) == len(out) else None


@functools.lru_cache(maxsize=1024)
def _reduction_dtype(name: str, dtype: np.dtype, ndim: int, kw: tuple) -> np.dtype | None:
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return np.asarray(getattr(np, name)(np.ones((1,) * ndim, dtype), **dict(kw))).dtype
    except Exception:  # noqa: BLE001
        return None


def reduction(name: str, a: Any, axis: Any = None, keepdims: bool = False, **kw: Any) -> tuple:
    """Shape and dtype of reduction `name` (sum, mean, max, argmax, var, cumsum, ...)."""
    shape, dtype = a._shape, a._dtype
    if shape is None or dtype is None:
        return Unknown
    ndim = len(shape)
    if name in ("cumsum", "cumprod"):
        if axis is None:
            out = (math.prod(shape),)
        elif normalize_axis(axis, ndim) is None or isinstance(axis, tuple):
            return Unknown
        else:
            out = shape
        kwd = {"axis": None if axis is None else axis % max(ndim, 1)}
    else:
        axes = normalize_axis(axis, ndim)
        if axes is None or (name in ("argmax", "argmin") and isinstance(axis, tuple)):
            return Unknown
        if keepdims:
            out = tuple(1 if i in axes else d for i, d in enumerate(shape))
        else:
            out = tuple(d for i, d in enumerate(shape) if i not in axes)
        kwd = {"axis": None if axis is None else (axes if isinstance(axis, tuple) else axes[0])}
    kwd.update({k: str(v) if k == "dtype" and v is not None else v for k, v in kw.items() if k in ("dtype", "ddof")})
    dt = _reduction_dtype(name, dtype, max(ndim, 0), tuple(sorted(kwd.items(), key=lambda kv: kv[0])))
    return (out, dt) if dt is not None else Unknown


def matmul(a: Any, b: Any) -> tuple:
    sa, sb = shape_of(a), shape_of(b)
    if sa is None or sb is None or len(sa) == 0 or len(sb) == 0:
        return Unknown
    dt = _ufunc_dtype("matmul", (_key(a), _key(b))) if _key(a)[0] == "a" and _key(b)[0] == "a" else None
    if dt is None:
        return Unknown
    a2 = sa if len(sa) > 1 else (1,) + sa
    b2 = sb if len(sb) > 1 else sb + (1,)
    if a2[-1] != b2[-2]:
        return Unknown
    try:
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError:
        return Unknown
    out = batch + ((a2[-2],) if len(sa) > 1 else ()) + ((b2[-1],) if len(sb) > 1 else ())
    return out, dt


def dot(a: Any, b: Any) -> tuple:
    sa, sb = shape_of(a), shape_of(b)
    if sa is None or sb is None:
        return Unknown
    if len(sa) <= 2 and len(sb) <= 2 and len(sa) and len(sb):
        return matmul(a, b)
    if len(sa) == 0 or len(sb) == 0:
        return elementwise("multiply", a, b)
    if sa[-1] != sb[-2 if len(sb) > 1 else -1]:
        return Unknown
    dt = _ufunc_dtype("matmul", (_key(a), _key(b)))
    return (sa[:-1] + sb[:-2] + sb[-1:], dt) if dt is not None else Unknown


_DUMMY = np.zeros(1, np.int8)


def getitem(a: Any, key: Any) -> tuple:
    """Basic indexing (ints, slices, None, Ellipsis) is inferred on a zero-stride stand-in of the
    same shape (no memory, no work); anything else (array indices, masks) is Unknown."""
    shape = a._shape
    if shape is None:
        return Unknown
    parts = key if isinstance(key, tuple) else (key,)
    if not all(p is None or p is Ellipsis or isinstance(p, slice) or (isinstance(p, int) and not isinstance(p, bool))
               for p in parts):
        return Unknown
    try:
        stand_in = np.lib.stride_tricks.as_strided(_DUMMY, shape=shape, strides=(0,) * len(shape))
        return stand_in[key].shape, a._dtype
    except (IndexError, TypeError, ValueError):
        return Unknown


def reshape(a: Any, shape: tuple[int, ...]) -> tuple:
    if a._shape is None:
        return Unknown
    size = math.prod(a._shape)
    if shape.count(-1) > 1:
        return Unknown
    known = math.prod(d for d in shape if d != -1)
    if -1 in shape:
        if known == 0 or size % known:
            return Unknown
        shape = tuple(size // known if d == -1 else d for d in shape)
    if math.prod(shape) != size or any(d < 0 for d in shape):
        return Unknown
    return shape, a._dtype


def transpose(a: Any, axes: tuple[int, ...] | None) -> tuple:
    if a._shape is None:
        return Unknown
    if axes is None:
        return a._shape[::-1], a._dtype
    n = len(a._shape)
    if sorted(x % n if n else x for x in axes) != list(range(n)) or len(axes) != n:
        return Unknown
    return tuple(a._shape[x] for x in axes), a._dtype


def concatenate(arrays: list, axis: int | None, stack: bool = False) -> tuple:
    shapes = [shape_of(x) for x in arrays]
    if not arrays or any(s is None for s in shapes) or any(getattr(x, "_dtype", 1) is None for x in arrays):
        return Unknown
    try:
        dt = np.result_type(*[getattr(x, "_dtype", None) or np.asarray(x).dtype for x in arrays])
    except TypeError:
        return Unknown
    if stack:
        if len(set(shapes)) != 1:
            return Unknown
        n = len(shapes[0]) + 1
        if axis is None or not -n <= axis < n:
            return Unknown
        ax = axis % n
        s = list(shapes[0])
        s.insert(ax, len(arrays))
        return tuple(s), dt
    if axis is None:
        return (sum(math.prod(s) for s in shapes),), dt
    n = len(shapes[0])
    if n == 0 or not -n <= axis < n or any(len(s) != n for s in shapes):
        return Unknown
    ax = axis % n
    if any(s[:ax] + s[ax + 1:] != shapes[0][:ax] + shapes[0][ax + 1:] for s in shapes):
        return Unknown
    out = list(shapes[0])
    out[ax] = sum(s[ax] for s in shapes)
    return tuple(out), dt
