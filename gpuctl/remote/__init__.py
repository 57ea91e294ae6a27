"""gpuctl.remote: a CuPy-compatible module whose arrays live on a remote GPU slice.

``import gpuctl.remote as cp`` and run CuPy code. The lease comes from ``GPUCTL_ATTACH``
(``tcp://HOST:PORT?lease=ID&token=HEX``, set by ``gpuctl run``) or from :func:`attach`.

What holds as in CuPy: array creation (array, asarray, empty, zeros, ones, full, arange,
linspace, eye, *_like), ``random`` (rand, randn, random, normal, uniform, randint, seed),
ndarray attributes and methods, indexing/slicing (basic indexing gives views), setitem, in-place
operators, arithmetic and comparison operators, matmul/dot/tensordot/einsum/outer, reductions with
axis (sum, mean, max, min, argmax, argmin, var, std, prod, any, all, cumsum), elementwise
functions, where, clip, concatenate/stack, ``.get()``, ``asnumpy``, ``cuda.Device().synchronize()``,
``cuda.runtime.memGetInfo()`` (for the slice), ``RawKernel`` (GPU nodes), and
``cuda.memory.OutOfMemoryError`` past the slice's memory quota. dtypes follow NumPy 2 promotion.

Also (gpuctl.remote._api, linalg, fft): pad, tile, repeat, split, flip, roll, moveaxis, take,
take_along_axis, nonzero, where(cond), unique*, searchsorted, diag, trace, tril, triu, meshgrid,
diff, cumprod, percentile, histogram, bincount, allclose, array_equal, broadcast_to/arrays, real,
imag, conj, round, nan_to_num, finfo/iinfo, astype, save/load, random.default_rng, linalg (norm,
solve, inv, det, svd, qr, cholesky, eigh, ...), fft, ElementwiseKernel (GPU nodes),
get_default_memory_pool, cuda.Stream. docs/CUPY-CONFORMANCE.md lists what exists, partly or not.

Errors raise where CuPy raises them: shape, axis, dtype and broadcasting errors at the call (from
the client's inference), OutOfMemoryError at the allocating call when the client's count of the
lease's live bytes says it cannot fit (the worker stays the authority). Errors only the worker can
see (an index array's values out of bounds, a singular matrix) surface at the next
synchronization point, naming the op. What does not hold: no streams (ops run in order), events,
``out=`` on reductions, ``strides``/``data`` pointers, ReductionKernel or sparse; NumPy arrays and
lists are accepted as operands (uploaded) where CuPy raises TypeError. See docs/DATAPATH.md.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpuctl.datapath.ops import BINARY_UFUNCS, UNARY_UFUNCS
from gpuctl.remote import _infer, cuda, fft, linalg, random  # noqa: F401 - cp.cuda, cp.random  # noqa: F401 - cp.fft, cp.linalg
from gpuctl.remote._api import (  # noqa: F401 - public names, as cupy exports them
    allclose,
    append,
    argwhere,
    around,
    array_equal,
    array_split,
    astype,
    atleast_1d,
    atleast_2d,
    atleast_3d,
    bincount,
    broadcast_arrays,
    broadcast_to,
    can_cast,
    column_stack,
    conj,
    conjugate,
    count_nonzero,
    cumprod,
    diag,
    diagflat,
    diagonal,
    diff,
    dstack,
    finfo,
    flatnonzero,
    flip,
    fliplr,
    flipud,
    histogram,
    hstack,
    iinfo,
    imag,
    isclose,
    isscalar,
    issubdtype,
    load,
    logspace,
    meshgrid,
    min_scalar_type,
    moveaxis,
    nan_to_num,
    ndim,
    nonzero,
    pad,
    percentile,
    promote_types,
    ravel,
    real,
    repeat,
    result_type,
    roll,
    rot90,
    save,
    searchsorted,
    size,
    split,
    swapaxes,
    take,
    take_along_axis,
    tile,
    trace,
    tri,
    tril,
    triu,
    unique,
    unique_all,
    unique_counts,
    unique_inverse,
    unique_values,
    vdot,
    vstack,
)
from gpuctl.remote._connection import (  # noqa: F401 - public names
    AttachError,
    Connection,
    RemoteError,
    UnknownOpError,
    WorkerLostError,
    attach,
    detach,
    get_connection,
    parse_attach,
)
from gpuctl.remote._ndarray import (
    _Temps,
    conn_of,
    dtype_name,
    enc,
    ndarray,
    new_op,
    operand,
    ufunc,
)
from gpuctl.remote.cuda import (  # noqa: F401  # noqa: F401
    ElementwiseKernel,
    OutOfMemoryError,
    RawKernel,
    get_default_memory_pool,
    get_default_pinned_memory_pool,
)

# dtypes and constants, as cupy exports them
bool_ = np.bool_
int8, int16, int32, int64 = np.int8, np.int16, np.int32, np.int64
uint8, uint16, uint32, uint64 = np.uint8, np.uint16, np.uint32, np.uint64
float16, float32, float64 = np.float16, np.float32, np.float64
complex64, complex128 = np.complex64, np.complex128
dtype = np.dtype
bool = np.bool_
int_, intp, uintp = np.int_, np.intp, np.uintp
half, single, double = np.float16, np.float32, np.float64
csingle, cdouble = np.complex64, np.complex128
byte, short, intc, longlong = np.byte, np.short, np.intc, np.longlong
ubyte, ushort, uintc, ulonglong = np.ubyte, np.ushort, np.uintc, np.ulonglong
generic, number, integer, signedinteger, unsignedinteger = np.generic, np.number, np.integer, np.signedinteger, np.unsignedinteger
inexact, floating, complexfloating = np.inexact, np.floating, np.complexfloating
euler_gamma = np.euler_gamma
newaxis = None
pi, e, inf, nan = np.pi, np.e, np.inf, np.nan


# -- creation ---------------------------------------------------------------------------------
def _shape_arg(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(d) for d in shape)


def array(obj: Any, dtype: Any = None, copy: bool = True, order: str = "C", ndmin: int = 0) -> ndarray:
    """A new remote array from `obj` (NumPy array, nested lists, scalar, or a remote array)."""
    if isinstance(obj, ndarray):
        out = obj.astype(dtype) if dtype is not None else (obj.copy() if copy else obj)
        return out
    # no host copy here: the upload copies small arrays and sends large ones before returning
    host = np.asarray(obj, dtype=dtype) if isinstance(obj, np.ndarray) and not ndmin else np.array(obj, dtype=dtype, ndmin=ndmin)
    conn = get_connection()
    return ndarray._wrap(conn, conn.upload(host), host.shape, host.dtype)


def asarray(obj: Any, dtype: Any = None, order: str | None = None, *, copy: bool | None = None) -> ndarray:
    """`obj` as a remote array; a remote array of the same dtype is returned as it is.
    copy=True always copies; copy=False raises ValueError when a copy is needed (always for host
    data, which must be uploaded; CuPy raises the same for NumPy input)."""
    if isinstance(obj, ndarray):
        same = dtype is None or np.dtype(dtype) == obj.dtype
        if copy is False and not same:
            raise ValueError("Unable to avoid copy while creating an array as requested.")
        if copy:
            return obj.astype(dtype) if not same else obj.copy()
        return obj if same else obj.astype(dtype)
    if copy is False:
        raise ValueError("Unable to avoid copy while creating an array as requested (host data is uploaded).")
    return array(obj, dtype=dtype)


def ascontiguousarray(a: Any, dtype: Any = None) -> ndarray:
    a = asarray(a, dtype)
    return new_op(a._conn, "ascontiguousarray", [a._ref], None, (a._shape, a._dtype))


def _creation(name: str, shape: Any, dtype: Any, extra: Sequence[Any] = ()) -> ndarray:
    s = _shape_arg(shape)
    d = dtype_name(dtype)
    conn = get_connection()
    return new_op(conn, name, [list(s), *extra, {"d": d}], None, (s, np.dtype(d)))


def empty(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    """Uninitialized array (contents are whatever the worker's memory held: never rely on them)."""
    return _creation("empty", shape, dtype)


def zeros(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    return _creation("zeros", shape, dtype)


def ones(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    return _creation("ones", shape, dtype)


def full(shape: Any, fill_value: Any, dtype: Any = None, order: str = "C") -> ndarray:
    d = np.full((), fill_value.item() if isinstance(fill_value, np.generic) else fill_value, dtype=dtype).dtype
    conn = get_connection()
    s = _shape_arg(shape)
    return new_op(conn, "full", [list(s), enc(conn, fill_value, _Temps()), {"d": dtype_name(d)}], None, (s, d))


def _like(name: str, a: ndarray, dtype: Any, extra: Sequence[Any] = ()) -> ndarray:
    a = asarray(a)
    if a._shape is not None:
        d = np.dtype(dtype) if dtype is not None else a.dtype
        if name == "full":
            return full(a._shape, extra[0], d)
        return _creation(name, a._shape, d)
    kw = {"dtype": {"d": dtype_name(dtype)}} if dtype is not None else None
    return new_op(a._conn, f"{name}_like", [a._ref, *extra], kw, (None, None))


def empty_like(a: ndarray, dtype: Any = None) -> ndarray:
    return _like("empty", a, dtype)


def zeros_like(a: ndarray, dtype: Any = None) -> ndarray:
    return _like("zeros", a, dtype)


def ones_like(a: ndarray, dtype: Any = None) -> ndarray:
    return _like("ones", a, dtype)


def full_like(a: ndarray, fill_value: Any, dtype: Any = None) -> ndarray:
    return _like("full", a, dtype, (fill_value,))


def arange(start: Any, stop: Any = None, step: Any = None, dtype: Any = None) -> ndarray:
    """Evenly spaced values in [start, stop) (NumPy's rules for the length and dtype)."""
    lo, hi = (0, start) if stop is None else (start, stop)
    st = 1 if step is None else step
    if st == 0:
        raise ValueError("arange: step must not be 0")
    n = builtins.max(0, math.ceil((hi - lo) / st))
    # NumPy's dtype: every one of start, stop and step counts (arange(2.5) and arange(1, 2.5) are float64)
    d = np.dtype(dtype) if dtype is not None else np.result_type(*[np.asarray(v) for v in (lo, hi, st)])
    conn = get_connection()
    return new_op(conn, "arange", [start, stop, step, {"d": dtype_name(d)}], None, ((n,), d))


def linspace(start: float, stop: float, num: int = 50, endpoint: bool = True, dtype: Any = None) -> ndarray:
    d = np.dtype(dtype) if dtype is not None else np.dtype(np.float64)
    conn = get_connection()
    return new_op(conn, "linspace", [start, stop, int(num), builtins.bool(endpoint), {"d": dtype_name(d)}], None,
                  ((int(num),), d))


def eye(N: int, M: int | None = None, k: int = 0, dtype: Any = float) -> ndarray:
    d = dtype_name(dtype)
    conn = get_connection()
    return new_op(conn, "eye", [int(N), None if M is None else int(M), int(k), {"d": d}], None,
                  ((int(N), int(N if M is None else M)), np.dtype(d)))


def identity(n: int, dtype: Any = float) -> ndarray:
    return eye(n, dtype=dtype)


# -- host transfer ----------------------------------------------------------------------------
def asnumpy(a: Any, stream: Any = None, order: str = "C", out: np.ndarray | None = None) -> np.ndarray:
    """A NumPy copy of `a` (remote arrays are fetched; anything else goes through np.asarray)."""
    if isinstance(a, ndarray):
        return a.get(out=out)
    return np.asarray(a)


def get_array_module(*args: Any) -> Any:
    """This module when any argument is a remote array, else numpy (as cupy.get_array_module)."""
    import builtins
    import sys

    return sys.modules[__name__] if builtins.any(isinstance(a, ndarray) for a in args) else np


# -- elementwise ------------------------------------------------------------------------------
def _make_ufunc(name: str):
    def f(*operands: Any, out: ndarray | None = None, dtype: Any = None) -> ndarray:
        return ufunc(name, *operands, out=out, dtype=dtype)

    f.__name__ = name
    f.__doc__ = f"Elementwise {name} (numpy.{name} semantics; result on the worker)."
    return f


for _name in (*UNARY_UFUNCS, *BINARY_UFUNCS):
    if _name not in ("conj", "conjugate"):
        globals()[_name] = _make_ufunc(_name)

round = around
round_ = around


def where(condition: Any, x: Any = None, y: Any = None) -> Any:
    """Elements of `x` where `condition`, else of `y`; ``where(condition)`` is ``nonzero(condition)``."""
    if x is None and y is None:
        return nonzero(condition)
    if x is None or y is None:
        raise ValueError("either both or neither of x and y should be given")
    conn = conn_of(condition, x, y)
    temps = _Temps()
    args = [operand(conn, v, temps) for v in (condition, x, y)]
    return new_op(conn, "where", args, None, _infer.where(condition, x, y))


def clip(a: Any, a_min: Any, a_max: Any) -> ndarray:
    conn = conn_of(a, a_min, a_max)
    temps = _Temps()
    args = [operand(conn, v, temps) for v in (a, a_min, a_max)]
    inferred = _infer.elementwise("clip", a, a_min, a_max) if a_min is not None and a_max is not None else (
        getattr(a, "_shape", None), getattr(a, "_dtype", None))
    return new_op(conn, "clip", args, None, inferred)


# -- linear algebra ---------------------------------------------------------------------------
def _two(name: str, a: Any, b: Any, inferred: tuple, extra: Sequence[Any] = ()) -> ndarray:
    conn = conn_of(a, b)
    temps = _Temps()
    return new_op(conn, name, [operand(conn, a, temps), operand(conn, b, temps), *extra], None, inferred)


def matmul(a: Any, b: Any) -> ndarray:
    """Matrix product (numpy.matmul rules; broadcasting over leading dimensions)."""
    return _two("matmul", a, b, _infer.matmul(a, b))


def dot(a: Any, b: Any) -> ndarray:
    return _two("dot", a, b, _infer.dot(a, b))


def tensordot(a: Any, b: Any, axes: Any = 2) -> ndarray:
    """numpy.tensordot; the result's shape is asked from the worker when needed."""
    conn = conn_of(a, b)
    ax = enc(conn, tuple(tuple(x) if isinstance(x, (list, tuple)) else x for x in axes)
             if isinstance(axes, (list, tuple)) else axes, _Temps())
    return _two("tensordot", a, b, (None, None), (ax,))


def outer(a: Any, b: Any) -> ndarray:
    sa, sb = _infer.shape_of(a), _infer.shape_of(b)
    inferred = _infer.elementwise("multiply", a, b)
    shape = (math.prod(sa), math.prod(sb)) if sa is not None and sb is not None else None
    return _two("outer", a, b, (shape, inferred[1]) if shape is not None and inferred[1] is not None else (None, None))


def einsum(subscripts: str, *operands: Any) -> ndarray:
    """numpy.einsum (explicit or implicit output); the shape is asked from the worker when needed."""
    conn = conn_of(*operands)
    temps = _Temps()
    return new_op(conn, "einsum", [subscripts, *[operand(conn, x, temps) for x in operands]], None, (None, None))


# -- joining ----------------------------------------------------------------------------------
def concatenate(arrays: Sequence[Any], axis: int | None = 0) -> ndarray:
    conn = conn_of(*arrays)
    temps = _Temps()
    enc_arrays = [operand(conn, x, temps) for x in arrays]
    return new_op(conn, "concatenate", [enc_arrays, axis], None, _infer.concatenate(list(arrays), axis))


def stack(arrays: Sequence[Any], axis: int = 0) -> ndarray:
    conn = conn_of(*arrays)
    temps = _Temps()
    enc_arrays = [operand(conn, x, temps) for x in arrays]
    return new_op(conn, "stack", [enc_arrays, axis], None, _infer.concatenate(list(arrays), axis, stack=True))


def reshape(a: ndarray, newshape: Any) -> ndarray:
    return asarray(a).reshape(newshape)


def transpose(a: ndarray, axes: Any = None) -> ndarray:
    return asarray(a).transpose(axes) if axes is not None else asarray(a).transpose()


def expand_dims(a: ndarray, axis: int) -> ndarray:
    a = asarray(a)
    inferred: tuple = (None, None)
    if a._shape is not None:
        s = list(a._shape)
        n = len(s) + 1
        _infer.check_axes(axis, n)  # numpy's AxisError at the call, as CuPy raises it
        s.insert(axis % n, 1)
        inferred = (tuple(s), a._dtype)
    return new_op(a._conn, "expand_dims", [a._ref, int(axis)], None, inferred)


def squeeze(a: ndarray, axis: Any = None) -> ndarray:
    return asarray(a).squeeze(axis)


# -- reductions -------------------------------------------------------------------------------
def sum(a, axis=None, dtype=None, out=None, keepdims=False):
    return asarray(a).sum(axis, dtype, out, keepdims)


def prod(a, axis=None, dtype=None, out=None, keepdims=False):
    return asarray(a).prod(axis, dtype, out, keepdims)


def mean(a, axis=None, dtype=None, out=None, keepdims=False):
    return asarray(a).mean(axis, dtype, out, keepdims)


def var(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
    return asarray(a).var(axis, dtype, out, ddof, keepdims)


def std(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
    return asarray(a).std(axis, dtype, out, ddof, keepdims)


def max(a, axis=None, out=None, keepdims=False):
    return asarray(a).max(axis, out, keepdims)


def min(a, axis=None, out=None, keepdims=False):
    return asarray(a).min(axis, out, keepdims)


amax, amin = max, min


def argmax(a, axis=None, out=None, *, keepdims=False):
    return asarray(a).argmax(axis, out, keepdims=keepdims)


def argmin(a, axis=None, out=None, *, keepdims=False):
    return asarray(a).argmin(axis, out, keepdims=keepdims)


def any(a, axis=None, out=None, keepdims=False):
    return asarray(a).any(axis, out, keepdims)


def all(a, axis=None, out=None, keepdims=False):
    return asarray(a).all(axis, out, keepdims)


def cumsum(a, axis=None, dtype=None, out=None):
    return asarray(a).cumsum(axis, dtype, out)


def sort(a: ndarray, axis: int = -1) -> ndarray:
    a = asarray(a)
    return new_op(a._conn, "sort", [a._ref, axis], None, (a._shape, a._dtype))


def argsort(a: ndarray, axis: int = -1) -> ndarray:
    a = asarray(a)
    return new_op(a._conn, "argsort", [a._ref, axis], None, (a._shape, np.dtype(np.int64)))


def synchronize() -> None:
    """Wait for every queued op of the default connection (cuda.Device().synchronize())."""
    get_connection().sync("sync")


def stats() -> dict[str, Any]:
    """The lease worker's accounting (memory_in_use_bytes, quota_bytes, bytes_in, bytes_out,
    ops_total, ops_per_s, ...). Not in CuPy."""
    return get_connection().sync("stats")


# Names that are also parameter names above (cupy.empty(shape), cupy.array(copy=)): bound last.
from gpuctl.remote import _api

copy = _api.copy
shape = _api.shape
