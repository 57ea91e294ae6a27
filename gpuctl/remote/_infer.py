"""Result shapes and dtypes computed on the client, so ops that return arrays need no round trip.

Each function returns ``(shape, dtype)``, or ``(None, None)`` when the answer is not known
without the worker (unknown input shape, data-dependent shape such as boolean masks). Where the
shapes, axes or dtypes known here make the op fail, it raises NumPy's (and CuPy's) exception at
the call, as CuPy does: ValueError for shapes that do not broadcast or align, numpy's AxisError
(an IndexError and ValueError) for an axis out of range, IndexError for an index out of bounds or
a boolean mask of the wrong shape, TypeError for a ufunc that has no loop for the dtypes. Errors
that depend on values (an integer index array out of bounds) still surface at the next
synchronization, naming the op. dtypes follow NumPy 2 promotion (NEP 50), computed by NumPy
itself on one-element arrays; the worker's answer wins when they differ.
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


#: Python scalar kinds as the keys name them (names, not values: 1, 1.0 and True are equal as
#: cache keys) and the value each is probed with.
_PROBE_SCALARS = {"bool": True, "int": 1, "float": 1.0, "complex": 1j}


@functools.lru_cache(maxsize=4096)
def _ufunc_result(name: str, key: tuple) -> np.dtype | TypeError | None:
    """The result dtype of ufunc `name` for operand kinds `key`; the TypeError NumPy raises when no
    loop fits (raised at the call by :func:`elementwise`); None when unknown."""
    operands = [np.ones(1, k[1]) if k[0] == "a" else _PROBE_SCALARS[k[1]] for k in key]
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return getattr(np, name)(*operands).dtype
    except TypeError as e:
        return TypeError(str(e))
    except Exception:  # noqa: BLE001 - the worker reports the real error
        return None


def _ufunc_dtype(name: str, key: tuple) -> np.dtype | None:
    r = _ufunc_result(name, key)
    return r if isinstance(r, np.dtype) else None


def broadcast_or_raise(*shapes: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The broadcast shape of `shapes` (None when one is unknown); ValueError, worded as CuPy's,
    when they do not broadcast. Cached per tuple of shapes (the hot path of every operator)."""
    if len(shapes) == 2:
        a, b = shapes
        if a == b:
            return a
        if a is None or b is None:
            return None
    elif any(s is None for s in shapes):
        return None
    return _broadcast(shapes)


@functools.lru_cache(maxsize=4096)
def _broadcast(shapes: tuple) -> tuple[int, ...]:
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        raise ValueError("operands could not be broadcast together with shapes "
                         + ", ".join(str(tuple(s)) for s in shapes)) from None


def check_axes(axis: Any, ndim: int) -> None:
    """Raise numpy's AxisError for an axis (or tuple of axes) out of range for `ndim`, ValueError for
    a repeated axis, TypeError for a non-integer axis."""
    if axis is None:
        return
    axes = axis if isinstance(axis, tuple) else (axis,)
    seen = set()
    for a in axes:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
            raise TypeError(f"an integer is required for the axis, got {a!r}")
        if not -max(ndim, 1) <= a < max(ndim, 1) or (ndim == 0 and a not in (0, -1)):
            raise np.exceptions.AxisError(int(a), ndim)
        n = int(a) % max(ndim, 1)
        if n in seen:
            raise ValueError("duplicate value in 'axis'")
        seen.add(n)


def _key(x: Any) -> tuple:
    dt = getattr(x, "_dtype", None)
    if dt is not None:
        return ("a", dt)
    if isinstance(x, np.ndarray):
        return ("a", x.dtype)
    if isinstance(x, bool):
        return ("s", "bool")
    if isinstance(x, int):
        return ("s", "int")
    if isinstance(x, float):
        return ("s", "float")
    if isinstance(x, complex):
        return ("s", "complex")
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
    if any(k[0] == "?" for k in keys):
        return Unknown
    shape = broadcast_or_raise(*shapes)
    if shape is None or any(k[0] == "a" and k[1] is None for k in keys):
        return Unknown
    dtype = _ufunc_result(name, keys)
    if isinstance(dtype, TypeError):
        raise TypeError(str(dtype))
    return (shape, dtype) if dtype is not None else Unknown


def where(c: Any, x: Any, y: Any) -> tuple:
    shapes = [shape_of(v) for v in (c, x, y)]
    shape = broadcast_or_raise(*shapes)
    if shape is None:
        return Unknown
    try:
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
    if name in ("argmax", "argmin", "cumsum", "cumprod") and isinstance(axis, tuple):
        raise TypeError(f"{name}: axis must be an integer or None, got a tuple")
    check_axes(axis, ndim)
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
    """Shape and dtype of a @ b; ValueError at the call for a 0-d operand, a core dimension
    mismatch or batch dimensions that do not broadcast (CuPy's and NumPy's errors). Cached per
    (shapes, dtypes) of two remote arrays."""
    da, db = getattr(a, "_dtype", None), getattr(b, "_dtype", None)
    if da is not None and db is not None:
        return _matmul_cached(a._shape, b._shape, da, db, a, b)
    return _matmul(a, b)


_MATMUL_CACHE: dict[tuple, tuple] = {}


def _matmul_cached(sa: Any, sb: Any, da: Any, db: Any, a: Any, b: Any) -> tuple:
    key = (sa, sb, da, db)
    r = _MATMUL_CACHE.get(key)
    if r is None:
        r = _matmul(a, b)  # raises for shapes that do not fit (not cached)
        if len(_MATMUL_CACHE) >= 4096:
            _MATMUL_CACHE.clear()
        _MATMUL_CACHE[key] = r
    return r


def _matmul(a: Any, b: Any) -> tuple:
    sa, sb = shape_of(a), shape_of(b)
    for i, s in enumerate((sa, sb)):
        if s is not None and len(s) == 0:
            raise ValueError(f"matmul: Input operand {i} does not have enough dimensions (has 0, gufunc core "
                             "with signature (n?,k),(k,m?)->(n?,m?) requires 1)")
    if sa is None or sb is None:
        return Unknown
    a2 = sa if len(sa) > 1 else (1,) + sa
    b2 = sb if len(sb) > 1 else sb + (1,)
    if a2[-1] != b2[-2]:
        raise ValueError(f"matmul: Input operand 1 has a mismatch in its core dimension 0, with gufunc signature "
                         f"(n?,k),(k,m?)->(n?,m?) (size {b2[-2]} is different from {a2[-1]})")
    try:
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError:
        raise ValueError(f"operands could not be broadcast together with remapped shapes {sa} {sb}") from None
    dt = _ufunc_dtype("matmul", (_key(a), _key(b))) if _key(a)[0] == "a" and _key(b)[0] == "a" else None
    if dt is None:
        return Unknown
    out = batch + ((a2[-2],) if len(sa) > 1 else ()) + ((b2[-1],) if len(sb) > 1 else ())
    return out, dt


def dot(a: Any, b: Any) -> tuple:
    sa, sb = shape_of(a), shape_of(b)
    if sa is None or sb is None:
        return Unknown
    if len(sa) and len(sb) and sa[-1] != sb[-2 if len(sb) > 1 else -1]:
        raise ValueError(f"shapes {sa} and {sb} not aligned: {sa[-1]} (dim {len(sa) - 1}) != "
                         f"{sb[-2 if len(sb) > 1 else -1]} (dim {max(len(sb) - 2, 0)})")
    if len(sa) <= 2 and len(sb) <= 2 and len(sa) and len(sb):
        return matmul(a, b)
    if len(sa) == 0 or len(sb) == 0:
        return elementwise("multiply", a, b)
    if sa[-1] != sb[-2 if len(sb) > 1 else -1]:
        raise ValueError(f"shapes {sa} and {sb} not aligned: {sa[-1]} (dim {len(sa) - 1}) != "
                         f"{sb[-2 if len(sb) > 1 else -1]} (dim {max(len(sb) - 2, 0)})")
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
    if len(parts) == 1 and _mask_shape(parts[0]) is not None:
        m = _mask_shape(parts[0])
        if len(m) > len(shape):
            raise IndexError(f"too many indices for array: array is {len(shape)}-dimensional, but {len(m)} were indexed")
        for ax, (d, md) in enumerate(zip(shape, m)):
            if d != md:
                raise IndexError(f"boolean index did not match indexed array along axis {ax}; size of axis is {d} "
                                 f"but size of corresponding boolean axis is {md}")
        return Unknown
    if not all(p is None or p is Ellipsis or isinstance(p, slice) or (isinstance(p, int) and not isinstance(p, bool))
               for p in parts):
        return Unknown
    stand_in = np.lib.stride_tricks.as_strided(_DUMMY, shape=shape, strides=(0,) * len(shape))
    try:
        return stand_in[key].shape, a._dtype
    except IndexError:
        raise  # out of bounds, too many indices: CuPy raises at the call
    except (TypeError, ValueError):
        return Unknown


def _mask_shape(k: Any) -> tuple[int, ...] | None:
    """The shape of a boolean mask index (remote or NumPy), None for anything else."""
    dt = getattr(k, "_dtype", None) if not isinstance(k, np.ndarray) else k.dtype
    if dt is not None and dt == np.bool_:
        return getattr(k, "_shape", None) if not isinstance(k, np.ndarray) else k.shape
    return None


def reshape(a: Any, shape: tuple[int, ...]) -> tuple:
    if a._shape is None:
        return Unknown
    size = math.prod(a._shape)
    if shape.count(-1) > 1:
        return Unknown
    known = math.prod(d for d in shape if d != -1)
    if -1 in shape:
        if known == 0 or size % known:
            raise ValueError(f"cannot reshape array of size {size} into shape {shape}")
        shape = tuple(size // known if d == -1 else d for d in shape)
    if any(d < 0 for d in shape):
        return Unknown
    if math.prod(shape) != size:
        raise ValueError(f"cannot reshape array of size {size} into shape {shape}")
    return shape, a._dtype


def transpose(a: Any, axes: tuple[int, ...] | None) -> tuple:
    if a._shape is None:
        return Unknown
    if axes is None:
        return a._shape[::-1], a._dtype
    n = len(a._shape)
    if len(axes) != n or sorted(x % n if n else x for x in axes) != list(range(n)):
        raise ValueError("axes don't match array")
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
            raise ValueError("all input arrays must have the same shape")
        n = len(shapes[0]) + 1
        if axis is None:
            return Unknown
        check_axes(axis, n)
        ax = axis % n
        s = list(shapes[0])
        s.insert(ax, len(arrays))
        return tuple(s), dt
    if axis is None:
        return (sum(math.prod(s) for s in shapes),), dt
    n = len(shapes[0])
    if n == 0:
        raise ValueError("zero-dimensional arrays cannot be concatenated")
    for i, s in enumerate(shapes):
        if len(s) != n:
            raise ValueError(f"all the input array dimensions except for the concatenation axis must match exactly, "
                             f"but array 0 has {n} dimension(s) and the array at index {i} has {len(s)} dimension(s)")
    check_axes(axis, n)
    ax = axis % n
    for i, s in enumerate(shapes):
        if s[:ax] + s[ax + 1:] != shapes[0][:ax] + shapes[0][ax + 1:]:
            raise ValueError("all the input array dimensions except for the concatenation axis must match exactly, "
                             f"but along dimension {next(j for j in range(n) if j != ax and s[j] != shapes[0][j])}, "
                             f"the array at index 0 has size {shapes[0][next(j for j in range(n) if j != ax and s[j] != shapes[0][j])]} "
                             f"and the array at index {i} has size {s[next(j for j in range(n) if j != ax and s[j] != shapes[0][j])]}")
    out = list(shapes[0])
    out[ax] = sum(s[ax] for s in shapes)
    return tuple(out), dt
