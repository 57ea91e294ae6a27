"""``gpuctl.remote.ndarray``: a handle to an array held by the lease's worker.

CuPy semantics that hold: operators, in-place operators (same-kind casting), basic indexing
returns views (writes through ``x[1:3] += 1`` reach ``x``), fancy and boolean indexing return
copies, ``.get()``/``cp.asnumpy`` copy to the host, implicit conversion to NumPy
(``np.asarray(x)``) raises TypeError as in CuPy, scalar conversions (``float(x)``) synchronize.

Differences from CuPy: errors of a queued op (shape mismatch, bad index, quota) are raised at the
next synchronization point, naming the op ("op #17 matmul(h3, h9): ..."), where CuPy raises shape
errors at once; ``.shape``/``.dtype`` are computed on the client and cost a round trip only when
the shape depends on data (boolean masks, einsum, tensordot); no ``strides``, ``data``, streams or
``out=`` on reductions; NumPy arrays and lists are accepted as operands (uploaded), where CuPy
refuses them; NumPy scalars act like Python scalars.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpuctl.remote import _infer
from gpuctl.remote._connection import Connection, get_connection

_WIRE = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64 complex64 complex128".split()
)


def dtype_name(dtype: Any) -> str:
    """The wire name of `dtype` (anything np.dtype accepts). TypeError for a dtype the data path
    does not carry (object, strings, datetimes)."""
    try:
        name = np.dtype(dtype).name
    except TypeError as e:
        raise TypeError(f"dtype {dtype!r} is not understood: {e}") from None
    if name not in _WIRE:
        raise TypeError(f"dtype {name} is not supported by gpuctl.remote (supported: {', '.join(sorted(_WIRE))})")
    return name


class _Temps(list):
    """Temporary uploads kept alive until the op that uses them is queued."""


def enc(conn: Connection, v: Any, temps: _Temps) -> Any:
    """Encode a structural argument (shape, axis, index, scalar, dtype) for the wire."""
    if isinstance(v, ndarray):
        if v._conn is not conn:
            raise ValueError("array belongs to another lease/connection: arrays cannot move between leases")
        return v._ref
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, np.generic):
        return enc(conn, v.item(), temps)
    if isinstance(v, complex):
        return {"c": [v.real, v.imag]}
    if isinstance(v, slice):
        return {"s": [None if x is None else _int(x) for x in (v.start, v.stop, v.step)]}
    if v is Ellipsis:
        return {"e": 1}
    if isinstance(v, tuple):
        return [enc(conn, x, temps) for x in v]
    if isinstance(v, (list, np.ndarray)):
        return operand(conn, v, temps)
    if isinstance(v, (np.dtype, type)):
        return {"d": dtype_name(v)}
    raise TypeError(f"unsupported argument of type {type(v).__name__}")


def _int(x: Any) -> int:
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return int(x)
    raise TypeError(f"slice indices must be integers or None, got {x!r}")


def operand(conn: Connection, v: Any, temps: _Temps) -> Any:
    """Encode an array operand: remote arrays by handle, scalars as themselves, NumPy arrays and
    lists uploaded (kept in `temps` until queued)."""
    if isinstance(v, ndarray):
        return enc(conn, v, temps)
    if isinstance(v, (np.ndarray, list)):
        host = np.asarray(v)
        t = ndarray._wrap(conn, conn.upload(host), host.shape, host.dtype)
        temps.append(t)
        return t._ref
    return enc(conn, v, temps)


def conn_of(*values: Any) -> Connection:
    """The connection of the first remote array among `values`, else the default connection."""
    for v in values:
        if isinstance(v, ndarray):
            return v._conn
        if isinstance(v, (list, tuple)):
            for x in v:
                if isinstance(x, ndarray):
                    return x._conn
    return get_connection()


#: The classes of np.dtype instances (one per dtype kind in NumPy 2): a dtype needs no np.dtype() call.
_DTYPE_TYPES = frozenset(type(np.dtype(n)) for n in (
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64 complex64 complex128".split()))

#: Ops whose result is a view of an input (no new memory on the worker): not counted by the
#: client's accounting of live bytes (Connection.account).
VIEW_OPS = frozenset({"getitem", "reshape", "transpose", "swapaxes", "squeeze", "expand_dims", "ravel",
                      "broadcast_to", "moveaxis", "flip", "real", "diagonal", "rot90"})


def new_op(conn: Connection, name: str, args: list, kwargs: dict | None, inferred: tuple) -> "ndarray":
    """Queue op `name` producing one new array (handle minted here); `inferred` is (shape, dtype).
    Raises OutOfMemoryError before queueing when a known-size result cannot fit in the slice."""
    h = conn.mint()
    shape, dtype = inferred
    if shape is not None and dtype is not None and name not in VIEW_OPS:
        nbytes = math.prod(shape) * (dtype.itemsize if type(dtype) in _DTYPE_TYPES else np.dtype(dtype).itemsize)
        if conn.live_bytes + nbytes > conn.quota_bytes:
            conn.account(h, nbytes, f"{name}{tuple(shape)}")  # checks (maybe asks the worker), raises or counts
        else:
            conn._owned[h] = nbytes
            conn.live_bytes += nbytes
    conn.enqueue(name, [h], args, kwargs)
    return ndarray._wrap(conn, h, shape, dtype)


def new_ops(conn: Connection, name: str, n: int, args: list, kwargs: dict | None,
            inferred: list) -> tuple["ndarray", ...]:
    """Queue op `name` producing `n` new arrays (one handle each); `inferred`: one (shape, dtype) each."""
    hs = [conn.mint() for _ in range(n)]
    for h, (shape, dtype) in zip(hs, inferred):
        if shape is not None and dtype is not None and name not in VIEW_OPS:
            conn.account(h, math.prod(shape) * np.dtype(dtype).itemsize, f"{name}{tuple(shape)}")
    conn.enqueue(name, hs, args, kwargs)
    return tuple(ndarray._wrap(conn, h, s, d) for h, (s, d) in zip(hs, inferred))


def ufunc(name: str, *operands: Any, out: "ndarray | None" = None, dtype: Any = None) -> "ndarray":
    """Apply allow-listed ufunc `name`. With `out` (a remote array), in place, returning `out`."""
    conn = conn_of(*operands, out)
    temps = _Temps()
    args = [operand(conn, x, temps) for x in operands]
    kwargs: dict[str, Any] = {}
    if dtype is not None:
        kwargs["dtype"] = {"d": dtype_name(dtype)}
    if out is not None:
        if not isinstance(out, ndarray):
            raise TypeError("out must be a gpuctl.remote.ndarray")
        kwargs["out"] = enc(conn, out, temps)
        conn.enqueue(name, [], args, kwargs)
        return out
    inferred = _infer.elementwise(name, *operands)
    if dtype is not None and inferred[0] is not None:
        inferred = (inferred[0], np.dtype(dtype))
    return new_op(conn, name, args, kwargs or None, inferred)


class ndarray:
    """An array on the lease's worker (see the module docstring for CuPy semantics held and not).

    ``ndarray(shape, dtype=float)`` allocates an uninitialized array, as in CuPy.
    """

    __slots__ = ("_conn", "_h", "_ref", "_shape", "_dtype", "__weakref__")
    __array_ufunc__ = None  # NumPy defers to our reflected operators (np_array + x -> x.__radd__)
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, shape: Any, dtype: Any = float):
        from gpuctl.remote import empty

        other = empty(shape, dtype)
        self._conn, self._h, self._ref = other._conn, other._h, other._ref
        self._shape, self._dtype = other._shape, other._dtype
        other._h = None

    @classmethod
    def _wrap(cls, conn: Connection, h: int, shape: Any, dtype: Any) -> "ndarray":
        self = object.__new__(cls)
        self._conn = conn
        self._h = h
        self._ref = {"h": h}
        self._shape = shape if type(shape) is tuple else (tuple(int(d) for d in shape) if shape is not None else None)
        self._dtype = dtype if type(dtype) in _DTYPE_TYPES else (np.dtype(dtype) if dtype is not None else None)
        return self

    def __del__(self) -> None:
        try:
            if self._h is not None:
                self._conn.free_later(self._h)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- metadata ------------------------------------------------------------------------------
    def _meta(self) -> None:
        r = self._conn.sync("meta", [self._ref])
        self._shape, self._dtype = tuple(r["shape"]), np.dtype(r["dtype"])

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape (tuple of ints); a round trip only when it depends on data."""
        if self._shape is None:
            self._meta()
        return self._shape  # type: ignore[return-value]

    @property
    def dtype(self) -> np.dtype:
        if self._dtype is None:
            self._meta()
        return self._dtype  # type: ignore[return-value]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of the array's elements (size * itemsize), as CuPy reports it."""
        return self.size * self.itemsize

    @property
    def T(self) -> "ndarray":
        return self.transpose()

    @property
    def mT(self) -> "ndarray":
        """The last two axes swapped (a view); ValueError for fewer than 2 dimensions."""
        if self.ndim < 2:
            raise ValueError("matrix transpose with ndim < 2 is undefined")
        return self.swapaxes(-1, -2)

    @property
    def handle(self) -> int:
        """This array's handle on its connection (for diagnostics)."""
        return self._h  # type: ignore[return-value]

    # -- host transfer and scalars ---------------------------------------------------------------
    def get(self, stream: Any = None, order: str = "C", out: np.ndarray | None = None) -> np.ndarray:
        """Copy to the host: a NumPy array (received straight into `out` when it fits). A
        synchronization point: raises the first error of any queued op."""
        arr = self._conn.get(self._h, out=out)
        self._shape, self._dtype = arr.shape, arr.dtype
        if out is not None and arr is not out:
            out[...] = arr
            return out
        return arr

    def item(self) -> Any:
        if self._shape is not None and math.prod(self._shape) != 1:
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        return self.get().item()

    def tolist(self) -> Any:
        return self.get().tolist()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __complex__(self) -> complex:
        return complex(self.item())

    def __bool__(self) -> bool:
        return bool(self.item())

    def __index__(self) -> int:
        if self.dtype.kind not in "iu":
            raise TypeError("only integer arrays can be used as an index")
        return int(self.item())

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()` "
                        "to construct a NumPy array explicitly.")

    def __repr__(self) -> str:
        return repr(self.get())

    def __str__(self) -> str:
        return str(self.get())

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        for i in range(self.shape[0]):
            yield self[i]

    # -- methods -------------------------------------------------------------------------------
    def _method(self, name: str, args: list, kwargs: dict | None, inferred: tuple) -> "ndarray":
        return new_op(self._conn, name, [self._ref, *args], kwargs, inferred)

    def astype(self, dtype: Any, copy: bool = True) -> "ndarray":
        name = dtype_name(dtype)
        if not copy and self._dtype == np.dtype(name):
            return self
        return self._method("astype", [{"d": name}], None, (self._shape, np.dtype(name)))

    def reshape(self, *shape: Any, order: str = "C") -> "ndarray":
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = tuple(int(d) for d in shape)
        return self._method("reshape", [list(shape)], {"order": order} if order != "C" else None,
                            _infer.reshape(self, shape))

    def transpose(self, *axes: Any) -> "ndarray":
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        ax = tuple(int(a) for a in axes) if axes else None
        return self._method("transpose", [list(ax)] if ax else [], None, _infer.transpose(self, ax))

    def swapaxes(self, a: int, b: int) -> "ndarray":
        _infer.check_axes(a, self.ndim)
        _infer.check_axes(b, self.ndim)
        ax = list(range(self.ndim))
        ax[a], ax[b] = ax[b], ax[a]
        return self._method("swapaxes", [a, b], None, _infer.transpose(self, tuple(ax)))

    def copy(self, order: str = "C") -> "ndarray":
        return self._method("copy", [], None, (self._shape, self._dtype))

    def ravel(self) -> "ndarray":
        return self._method("ravel", [], None, _infer.reshape(self, (-1,)) if self._shape is not None else (None, None))

    def flatten(self) -> "ndarray":
        return self._method("flatten", [], None, _infer.reshape(self, (-1,)) if self._shape is not None else (None, None))

    def squeeze(self, axis: Any = None) -> "ndarray":
        inferred: tuple = (None, None)
        if isinstance(axis, list):
            axis = tuple(axis)
        if self._shape is not None:
            stand_in = np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), self._shape, (0,) * len(self._shape))
            inferred = (np.squeeze(stand_in, axis).shape, self._dtype)  # numpy's errors at the call
        return self._method("squeeze", [], {"axis": enc(self._conn, axis, _Temps())} if axis is not None else None,
                            inferred)

    def fill(self, value: Any) -> None:
        self._conn.enqueue("fill", [], [self._ref, enc(self._conn, value, _Temps())])

    def dot(self, other: Any) -> "ndarray":
        from gpuctl.remote import dot

        return dot(self, other)

    def _reduce(self, name: str, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False,
                **kw: Any) -> "ndarray":
        if out is not None:
            raise TypeError(f"{name}: out= is not supported by gpuctl.remote")
        kwargs: dict[str, Any] = {}
        if dtype is not None:
            kwargs["dtype"] = {"d": dtype_name(dtype)}
        if keepdims:
            kwargs["keepdims"] = True
        kwargs.update({k: v for k, v in kw.items() if v is not None})
        ax = tuple(axis) if isinstance(axis, list) else axis
        inferred = _infer.reduction(name, self, ax, keepdims, **({"dtype": dtype_name(dtype)} if dtype else {}), **kw)
        return self._method(name, [enc(self._conn, ax, _Temps())], kwargs or None, inferred)

    def sum(self, axis=None, dtype=None, out=None, keepdims=False):
        return self._reduce("sum", axis, dtype, out, keepdims)

    def prod(self, axis=None, dtype=None, out=None, keepdims=False):
        return self._reduce("prod", axis, dtype, out, keepdims)

    def mean(self, axis=None, dtype=None, out=None, keepdims=False):
        return self._reduce("mean", axis, dtype, out, keepdims)

    def var(self, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
        return self._reduce("var", axis, dtype, out, keepdims, ddof=ddof or None)

    def std(self, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
        return self._reduce("std", axis, dtype, out, keepdims, ddof=ddof or None)

    def max(self, axis=None, out=None, keepdims=False):
        return self._reduce("max", axis, None, out, keepdims)

    def min(self, axis=None, out=None, keepdims=False):
        return self._reduce("min", axis, None, out, keepdims)

    def argmax(self, axis=None, out=None, *, keepdims=False):
        return self._reduce("argmax", axis, None, out, keepdims)

    def argmin(self, axis=None, out=None, *, keepdims=False):
        return self._reduce("argmin", axis, None, out, keepdims)

    def any(self, axis=None, out=None, keepdims=False):
        return self._reduce("any", axis, None, out, keepdims)

    def all(self, axis=None, out=None, keepdims=False):
        return self._reduce("all", axis, None, out, keepdims)

    def cumsum(self, axis=None, dtype=None, out=None):
        return self._reduce("cumsum", axis, dtype, out)

    def cumprod(self, axis=None, dtype=None, out=None):
        return self._reduce("cumprod", axis, dtype, out)

    def clip(self, a_min=None, a_max=None):
        from gpuctl.remote import clip

        return clip(self, a_min, a_max)

    # -- indexing ------------------------------------------------------------------------------
    def _key(self, key: Any, temps: _Temps) -> Any:
        if isinstance(key, tuple):
            return [self._key1(k, temps) for k in key]
        return self._key1(key, temps)

    def _key1(self, k: Any, temps: _Temps) -> Any:
        if isinstance(k, (list, np.ndarray)):
            return operand(self._conn, k, temps)
        if isinstance(k, np.integer):
            return int(k)
        return enc(self._conn, k, temps)

    def __getitem__(self, key: Any) -> "ndarray":
        temps = _Temps()
        return self._method("getitem", [self._key(key, temps)], None, _infer.getitem(self, key))

    def __setitem__(self, key: Any, value: Any) -> None:
        temps = _Temps()
        self._conn.enqueue("setitem", [], [self._ref, self._key(key, temps), operand(self._conn, value, temps)])

    # -- operators -----------------------------------------------------------------------------
    def __neg__(self):
        return ufunc("negative", self)

    def __pos__(self):
        return ufunc("positive", self)

    def __abs__(self):
        return ufunc("absolute", self)

    def __invert__(self):
        return ufunc("invert", self)

    def __matmul__(self, other):
        if type(other) is ndarray and other._conn is self._conn:  # hot path: both remote, no uploads
            return new_op(self._conn, "matmul", [self._ref, other._ref], None, _infer.matmul(self, other))
        from gpuctl.remote import matmul

        return matmul(self, other)

    def __rmatmul__(self, other):
        from gpuctl.remote import matmul

        return matmul(other, self)


_UNCHECKED = object()
#: (ufunc, dtype of the target, type or dtype of the operand) -> None or the casting error message.
_INPLACE_CHECKED: dict[tuple, str | None] = {}


_PY_SCALARS = frozenset({int, float, complex, bool})


def _inplace_error(name: str, dtype: Any, other: Any) -> str | None:
    """NumPy's error for ``x op= other`` when the result cannot be cast back into x's dtype under
    same_kind casting (``int_array += 1.5``), or None when it can or is not known here."""
    if dtype is None or (isinstance(other, ndarray) and other._dtype is None):
        return None
    if isinstance(other, ndarray):
        probe = np.ones(1, other._dtype)
    elif isinstance(other, np.ndarray):
        probe = np.ones(1, other.dtype)  # by dtype only: the cache key holds no shape or value
    elif isinstance(other, (int, float, complex, bool)):
        probe = type(other)(1)
    else:
        probe = other
    try:
        with np.errstate(all="ignore"):
            getattr(np, name)(np.ones(1, dtype), probe, out=np.ones(1, dtype))
    except TypeError as e:
        return str(e)
    except Exception:  # noqa: BLE001 - the worker reports anything else
        return None
    return None


#: (ufunc, dtype, type of a Python scalar operand or dtype of a same-shape array) -> result dtype:
#: the hot path of ``y = x * 2`` and ``z = x + y`` (no broadcasting to work out).
_RESULT_DTYPES: dict[tuple, Any] = {}
_SCALAR_KEYS = {int: ("s", "int"), float: ("s", "float"), bool: ("s", "bool")}


def _fast_binary(name: str, self: "ndarray", other: Any, t: type, reflected: bool) -> "ndarray | None":
    """``self op other`` queued without the general ufunc path when `other` is a Python number or a
    same-shape array of the same connection and every dtype is known; None otherwise."""
    dt = self._dtype
    if dt is None or self._shape is None:
        return None
    if t is ndarray:
        if other._conn is not self._conn or other._shape != self._shape or other._dtype is None:
            return None
        key = (name, dt, other._dtype, reflected)
        arg = other._ref
    else:
        key = (name, dt, t, reflected)
        arg = other
    rdt = _RESULT_DTYPES.get(key)
    if rdt is None:
        keys = [("a", dt), ("a", other._dtype) if t is ndarray else _SCALAR_KEYS[t]]
        if reflected:
            keys.reverse()
        r = _infer._ufunc_result(name, tuple(keys))
        if not isinstance(r, np.dtype):
            return None  # unknown or an error: the general path raises it
        rdt = _RESULT_DTYPES[key] = r
    args = [arg, self._ref] if reflected else [self._ref, arg]
    return new_op(self._conn, name, args, None, (self._shape, rdt))


def _binary(name: str):
    def op(self, other):
        t = type(other)
        if t is int or t is float or t is ndarray:
            r = _fast_binary(name, self, other, t, False)
            if r is not None:
                return r
        return ufunc(name, self, other)

    def rop(self, other):
        t = type(other)
        if t is int or t is float:
            r = _fast_binary(name, self, other, t, True)
            if r is not None:
                return r
        return ufunc(name, other, self)

    def iop(self, other):
        t = type(other)
        if t is ndarray:
            okind = other._dtype
        elif t is np.ndarray:
            okind = other.dtype
        elif t in _PY_SCALARS or issubclass(t, np.generic):
            okind = t
        else:
            okind = None  # lists and the like: the worker checks
        if okind is not None:
            key = (name, self._dtype, okind)
            err = _INPLACE_CHECKED.get(key, _UNCHECKED)
            if err is _UNCHECKED:
                err = _inplace_error(name, self._dtype, other)
                _INPLACE_CHECKED[key] = err
            if err is not None:
                raise TypeError(err)
        if t is float or t is int or (t is ndarray and other._conn is self._conn):  # fast path
            ref = self._ref
            self._conn.enqueue(name, [], [ref, other._ref if t is ndarray else other], {"out": ref})
        else:
            ufunc(name, self, other, out=self)
        return self

    return op, rop, iop


for _dunder, _uf in {
    "add": "add", "sub": "subtract", "mul": "multiply", "truediv": "true_divide", "floordiv": "floor_divide",
    "mod": "remainder", "pow": "power", "and": "bitwise_and", "or": "bitwise_or", "xor": "bitwise_xor",
    "lshift": "left_shift", "rshift": "right_shift",
}.items():
    _op, _rop, _iop = _binary(_uf)
    setattr(ndarray, f"__{_dunder}__", _op)
    setattr(ndarray, f"__r{_dunder}__", _rop)
    setattr(ndarray, f"__i{_dunder}__", _iop)

for _dunder, _uf in {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal", "gt": "greater",
                     "ge": "greater_equal"}.items():
    setattr(ndarray, f"__{_dunder}__", _binary(_uf)[0])
