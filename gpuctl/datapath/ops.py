"""The allow-list of array operations a data-path worker runs, and their implementations.

Each entry of :data:`OPS` maps a wire name to an :class:`Op`: a function called as
``fn(session, *args, **kwargs)`` with handles already resolved to executor arrays, the keyword
arguments it accepts (anything else is a TypeError naming the op), and optionally ``estimate``,
which gives the bytes of the result before it is computed so that creation and broadcasting ops
are refused by the quota before they allocate. Functions reach the array module through
``session.xp`` (numpy or cupy), so one table serves both executors.

Anything not in this table is refused ("unknown op 'x'"); there is no getattr on a name coming
from the wire except through these fixed tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from gpuctl.datapath.protocol import ALLOWED_DTYPES, DEFAULT_LIMITS, WIRE_DTYPES


@dataclass(frozen=True)
class Op:
    """One allowed operation. kwargs: accepted keyword names. estimate(args, kwargs) -> bytes of
    the result, or None when unknown before running."""

    fn: Callable[..., Any]
    kwargs: frozenset[str] = field(default_factory=frozenset)
    estimate: Callable[..., int | None] | None = None
    #: Argument positions (wire args, 0 = first) and keyword names that may hold a string (a dtype
    #: name, einsum subscripts, an order or casting word). A string anywhere else is refused: NumPy
    #: would turn it into a string array (np.multiply("x" * 2**20, 2**12) is a 4 GiB string).
    text: frozenset[int | str] = field(default_factory=frozenset)


def _shape(shape: Any) -> tuple[int, ...]:
    """Normalize and bound a shape argument: int or tuple of non-negative ints."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (int(shape),)
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise TypeError(f"shape must be an int or a tuple of ints, got {shape!r}")
    if len(shape) > DEFAULT_LIMITS.max_ndim:
        raise ValueError(f"shape has {len(shape)} dimensions (limit {DEFAULT_LIMITS.max_ndim})")
    if any(d < 0 for d in shape):
        raise ValueError(f"negative dimensions are not allowed: {shape}")
    n = math.prod(shape)
    if n > DEFAULT_LIMITS.max_elements:
        raise ValueError(f"shape {shape} has {n} elements (limit {DEFAULT_LIMITS.max_elements})")
    return shape


def _itemsize(dtype: Any, default: str = "float64") -> int:
    return np.dtype(_dt(dtype) if dtype is not None else default).itemsize


def _est_shape(pos: int, dtype_pos: int | None = None, default: str = "float64"):
    def est(args: tuple, kwargs: dict) -> int:
        shape = _shape(args[pos] if len(args) > pos else kwargs.get("shape", kwargs.get("size", ())))
        dtype = kwargs.get("dtype", args[dtype_pos] if dtype_pos is not None and len(args) > dtype_pos else None)
        return math.prod(shape) * _itemsize(dtype, default)

    return est


def _est_broadcast(args: tuple, kwargs: dict) -> int | None:
    shapes = [a.shape for a in args if hasattr(a, "shape")]
    if not shapes:
        return None
    try:
        out = np.broadcast_shapes(*shapes)
    except ValueError:
        return None  # the op itself raises the real error
    itemsize = max(a.dtype.itemsize for a in args if hasattr(a, "dtype"))
    return math.prod(out) * max(itemsize, 8 if any(isinstance(a, float) for a in args) and itemsize < 4 else itemsize)


def _est_matmul(args: tuple, kwargs: dict) -> int | None:
    a, b = args[0], args[1]
    if not (hasattr(a, "shape") and hasattr(b, "shape")) or a.ndim < 2 or b.ndim < 2:
        return None
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        return None
    return math.prod(batch) * a.shape[-2] * b.shape[-1] * max(a.dtype.itemsize, b.dtype.itemsize)


def _dt(v: Any) -> str | None:
    """A dtype argument checked against the wire dtypes (protocol.ALLOWED_DTYPES); None stays None.

    Raises TypeError for anything else: object ("O", a pointer per element, Python objects in every
    op), string/void/structured/sub-array dtypes ("U1048576", "V1000000000", "(1000,1000)f8": an
    itemsize the estimates would not see), datetimes, or a non-string.
    """
    if v is None:
        return None
    if isinstance(v, str) and str(v) in ALLOWED_DTYPES:
        return str(v)
    raise TypeError(f"dtype {str(v)[:40]!r} is not allowed (allowed: {', '.join(WIRE_DTYPES)})")


def _kw(kwargs: dict) -> dict:
    if "dtype" in kwargs:
        kwargs = dict(kwargs, dtype=_dt(kwargs["dtype"]))
    return kwargs


def has_text(v: Any) -> bool:
    """True when `v` is a string or a tuple holding one (at any depth)."""
    if isinstance(v, str):
        return True
    return type(v) is tuple and any(has_text(x) for x in v)


# --------------------------------------------------------------------------------------------
# elementwise

UNARY_UFUNCS = (
    "negative positive absolute abs exp exp2 expm1 log log2 log10 log1p sqrt square cbrt reciprocal "
    "sin cos tan arcsin arccos arctan sinh cosh tanh arcsinh arccosh arctanh sign floor ceil trunc "
    "rint isnan isinf isfinite logical_not invert signbit"
).split()
BINARY_UFUNCS = (
    "add subtract multiply divide true_divide floor_divide remainder mod power float_power "
    "maximum minimum fmax fmin equal not_equal less less_equal greater greater_equal "
    "logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor left_shift "
    "right_shift arctan2 hypot copysign"
).split()


def _ufunc(name: str) -> Callable[..., Any]:
    def fn(s, *args, **kwargs):
        return getattr(s.xp, name)(*args, **(_kw(kwargs) if kwargs else kwargs))

    return fn


OPS: dict[str, Op] = {}
for _n in UNARY_UFUNCS:
    OPS[_n] = Op(_ufunc(_n), frozenset({"out", "dtype"}), _est_broadcast, frozenset({"dtype"}))
for _n in BINARY_UFUNCS:
    OPS[_n] = Op(_ufunc(_n), frozenset({"out", "dtype", "casting"}), _est_broadcast, frozenset({"dtype", "casting"}))


# --------------------------------------------------------------------------------------------
# creation


def _empty(s, shape, dtype="float64"):
    return s.xp.empty(_shape(shape), dtype=_dt(dtype))


def _zeros(s, shape, dtype="float64"):
    return s.xp.zeros(_shape(shape), dtype=_dt(dtype))


def _ones(s, shape, dtype="float64"):
    return s.xp.ones(_shape(shape), dtype=_dt(dtype))


def _full(s, shape, fill_value, dtype=None):
    return s.xp.full(_shape(shape), fill_value, dtype=_dt(dtype))


def _arange(s, start, stop=None, step=None, dtype=None):
    n = _arange_len(start, stop, step)
    if n > DEFAULT_LIMITS.max_elements:
        raise ValueError(f"arange of {n} elements (limit {DEFAULT_LIMITS.max_elements})")
    return s.xp.arange(start, stop, step, dtype=_dt(dtype))


def _arange_len(start, stop, step) -> int:
    if stop is None:
        start, stop = 0, start
    step = 1 if step is None else step
    if not all(isinstance(v, (int, float)) for v in (start, stop, step)):
        raise TypeError("arange: start, stop and step must be numbers")
    if step == 0:
        raise ValueError("arange: step must not be 0")
    return max(0, math.ceil((stop - start) / step))


def _est_arange(args, kwargs):
    start, stop, step = (list(args) + [None, None, None])[:3]
    floating = any(isinstance(v, float) for v in (start, stop, step))
    dtype = kwargs.get("dtype") or (args[3] if len(args) > 3 else None)
    return _arange_len(start, stop, step) * _itemsize(dtype, "float64" if floating else "int64")


def _linspace(s, start, stop, num=50, endpoint=True, dtype=None):
    if not all(isinstance(v, (int, float, complex)) for v in (start, stop)):
        raise TypeError("linspace: start and stop must be numbers")  # arrays would give num x size elements
    if not isinstance(num, int) or num < 0 or num > DEFAULT_LIMITS.max_elements:
        raise ValueError(f"linspace num must be 0..{DEFAULT_LIMITS.max_elements}, got {num!r}")
    return s.xp.linspace(start, stop, num, endpoint=endpoint, dtype=_dt(dtype))


def _eye(s, n, m=None, k=0, dtype="float64"):
    _shape((n, m if m is not None else n))
    return s.xp.eye(n, m, k, dtype=_dt(dtype))


def _like(kind: str):
    def fn(s, a, *rest, dtype=None):
        f = getattr(s.xp, kind)
        return f(a, *rest, dtype=_dt(dtype))

    return fn


def _est_like(args: tuple, kwargs: dict) -> int:
    a, dtype = args[0], kwargs.get("dtype")
    return a.size * (_itemsize(dtype) if dtype is not None else a.dtype.itemsize)


OPS.update(
    empty=Op(_empty, frozenset({"dtype"}), _est_shape(0, 1), frozenset({1, "dtype"})),
    zeros=Op(_zeros, frozenset({"dtype"}), _est_shape(0, 1), frozenset({1, "dtype"})),
    ones=Op(_ones, frozenset({"dtype"}), _est_shape(0, 1), frozenset({1, "dtype"})),
    full=Op(_full, frozenset({"dtype"}), _est_shape(0, 2), frozenset({2, "dtype"})),
    arange=Op(_arange, frozenset({"dtype"}), _est_arange, frozenset({3, "dtype"})),
    linspace=Op(_linspace, frozenset({"num", "endpoint", "dtype"}),
                lambda a, k: (a[2] if len(a) > 2 else k.get("num", 50)) * 16 if isinstance(a[2] if len(a) > 2 else k.get("num", 50), int) else None,
                frozenset({4, "dtype"})),
    eye=Op(_eye, frozenset({"dtype", "k"}), lambda a, k: a[0] * (a[1] if len(a) > 1 and a[1] is not None else a[0]) * 8,
           frozenset({3, "dtype"})),
    empty_like=Op(_like("empty_like"), frozenset({"dtype"}), _est_like, frozenset({"dtype"})),
    zeros_like=Op(_like("zeros_like"), frozenset({"dtype"}), _est_like, frozenset({"dtype"})),
    ones_like=Op(_like("ones_like"), frozenset({"dtype"}), _est_like, frozenset({"dtype"})),
    full_like=Op(_like("full_like"), frozenset({"dtype"}), _est_like, frozenset({"dtype"})),
)


# --------------------------------------------------------------------------------------------
# random (per-connection generator, seeded by random_seed)


def _size(size):
    return None if size is None else _shape(size)


def _est_size(pos: int):
    def est(args, kwargs):
        size = args[pos] if len(args) > pos else kwargs.get("size")
        return 8 * math.prod(_shape(size)) if size is not None else 8

    return est


OPS.update(
    random_seed=Op(lambda s, seed=None: s.seed_rng(seed)),
    rand=Op(lambda s, shape: s.rng().rand(*_shape(shape)), frozenset(), _est_size(0)),
    randn=Op(lambda s, shape: s.rng().randn(*_shape(shape)), frozenset(), _est_size(0)),
    random_sample=Op(lambda s, size=None: s.rng().random_sample(_size(size)), frozenset({"size"}), _est_size(0)),
    normal=Op(lambda s, loc=0.0, scale=1.0, size=None: s.rng().normal(loc, scale, _size(size)),
              frozenset({"loc", "scale", "size"}), _est_size(2)),
    uniform=Op(lambda s, low=0.0, high=1.0, size=None: s.rng().uniform(low, high, _size(size)),
               frozenset({"low", "high", "size"}), _est_size(2)),
    randint=Op(lambda s, low, high=None, size=None, dtype="int64":
               s.rng().randint(low, high, _size(size), dtype=_dt(dtype)),
               frozenset({"high", "size", "dtype"}), _est_size(2), frozenset({3, "dtype"})),
)


# --------------------------------------------------------------------------------------------
# array methods, indexing


def _check_key(key):
    parts = key if isinstance(key, tuple) else (key,)
    for p in parts:
        if not (p is None or p is Ellipsis or isinstance(p, (int, slice, bool)) or hasattr(p, "shape")
                or (isinstance(p, tuple) and all(isinstance(x, (int, bool)) for x in p))):
            raise IndexError(f"index element {p!r} is not allowed (int, slice, None, ..., array)")
    return key


def _getitem(s, a, key):
    return a[_check_key(key)]


def _setitem(s, a, key, value):
    a[_check_key(key)] = value


def _fill(s, a, value):
    a.fill(value)


def _reshape(s, a, shape, order="C"):
    dims = (shape,) if isinstance(shape, int) else shape
    if not isinstance(dims, tuple) or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        raise TypeError(f"reshape: shape must be an int or a tuple of ints, got {shape!r}")
    if len(dims) > DEFAULT_LIMITS.max_ndim:
        raise ValueError(f"reshape: {len(dims)} dimensions (limit {DEFAULT_LIMITS.max_ndim})")
    return a.reshape(dims, order=order)


def _est_copy(args: tuple, kwargs: dict) -> int:
    """Bytes of a result that copies its input when the input is not C-contiguous (ravel, reshape,
    ascontiguousarray): its logical size, which for a broadcast view is far more than its memory."""
    a = args[0]
    return 0 if a.flags.c_contiguous else a.nbytes


def _est_getitem(args: tuple, kwargs: dict) -> int | None:
    """Bytes of ``a[key]`` when the key holds integer arrays (advanced indexing copies: a (1, n) array
    indexed by n zeros is n x n elements); None for basic indexing (a view) or a boolean mask (at most
    a's size). Integer tuples inside the key count as 1-D integer arrays."""
    a, key = args[0], args[1]
    parts = key if isinstance(key, tuple) else (key,)
    idx_shapes, taken, used = [], set(), 0
    ints = []
    for p in parts:
        if p is None or p is Ellipsis:
            ints.append(None)
            continue
        if isinstance(p, tuple) or (hasattr(p, "shape") and p.dtype.kind != "b"):
            ints.append("adv")
            idx_shapes.append((len(p),) if isinstance(p, tuple) else tuple(p.shape))
        elif hasattr(p, "shape"):
            ints.append(("bool", p.ndim))
        else:
            ints.append("dim")
    if not idx_shapes:
        return None
    n_named = sum(1 if x in ("adv", "dim") else (x[1] if isinstance(x, tuple) else 0) for x in ints)
    dim = 0
    for p, x in zip(parts, ints):
        if p is Ellipsis:
            dim += max(0, a.ndim - n_named)
        elif x == "adv":
            taken.add(dim)
            dim += 1
        elif x == "dim":
            taken.add(dim)  # an integer index drops its dimension
            dim += 1
        elif isinstance(x, tuple):
            dim += x[1]
    used = math.prod(a.shape[d] for d in range(a.ndim) if d not in taken)
    try:
        idx = math.prod(np.broadcast_shapes(*idx_shapes))
    except ValueError:
        return None  # numpy raises the real error
    return idx * used * a.dtype.itemsize


def _astype(s, a, dtype, copy=True):
    return a.astype(_dt(dtype), copy=copy)


OPS.update(
    getitem=Op(_getitem, frozenset(), _est_getitem),
    setitem=Op(_setitem),
    fill=Op(_fill),
    astype=Op(_astype, frozenset({"copy"}), lambda a, k: a[0].size * _itemsize(a[1]), frozenset({1})),
    reshape=Op(_reshape, frozenset({"order"}), _est_copy, frozenset({2, "order"})),
    transpose=Op(lambda s, a, axes=None: a.transpose(axes) if axes is not None else a.T),
    copy=Op(lambda s, a: a.copy(), frozenset(), lambda a, k: a[0].nbytes),
    ravel=Op(lambda s, a: a.ravel(), frozenset(), _est_copy),
    flatten=Op(lambda s, a: a.flatten(), frozenset(), lambda a, k: a[0].nbytes),
    squeeze=Op(lambda s, a, axis=None: a.squeeze(axis), frozenset({"axis"})),
    expand_dims=Op(lambda s, a, axis: s.xp.expand_dims(a, axis)),
    swapaxes=Op(lambda s, a, i, j: a.swapaxes(i, j)),
    moveaxis=Op(lambda s, a, src, dst: s.xp.moveaxis(a, src, dst)),
    broadcast_to=Op(lambda s, a, shape: s.xp.broadcast_to(a, _shape(shape))),
    flip=Op(lambda s, a, axis=None: s.xp.flip(a, axis), frozenset({"axis"})),
    sort=Op(lambda s, a, axis=-1: s.xp.sort(a, axis=axis), frozenset({"axis"}), lambda a, k: a[0].nbytes),
    argsort=Op(lambda s, a, axis=-1: s.xp.argsort(a, axis=axis), frozenset({"axis"}), lambda a, k: a[0].size * 8),
    ascontiguousarray=Op(lambda s, a: s.xp.ascontiguousarray(a), frozenset(), _est_copy),
)


# --------------------------------------------------------------------------------------------
# reductions


def _est_cumulative(args: tuple, kwargs: dict) -> int:
    a, dtype = args[0], kwargs.get("dtype")
    return a.size * (_itemsize(dtype) if dtype is not None else max(a.dtype.itemsize, 8))


def _reduction(name: str):
    def fn(s, a, axis=None, **kwargs):
        return getattr(s.xp, name)(a, axis=axis, **_kw(kwargs))

    return fn


for _n, _kws in {
    "sum": {"dtype", "keepdims"}, "prod": {"dtype", "keepdims"}, "mean": {"dtype", "keepdims"},
    "max": {"keepdims"}, "min": {"keepdims"}, "amax": {"keepdims"}, "amin": {"keepdims"},
    "argmax": set(), "argmin": set(), "var": {"dtype", "ddof", "keepdims"},
    "std": {"dtype", "ddof", "keepdims"}, "any": {"keepdims"}, "all": {"keepdims"},
    "cumsum": {"dtype"}, "cumprod": {"dtype"}, "count_nonzero": set(),
}.items():
    OPS[_n] = Op(_reduction(_n), frozenset(_kws), _est_cumulative if _n.startswith("cum") else None,
                 frozenset({"dtype"}))


# --------------------------------------------------------------------------------------------
# linear algebra, joining, selection


def _einsum(s, subscripts, *operands):
    if not isinstance(subscripts, str):
        raise TypeError("einsum: the first argument must be the subscripts string")
    return s.xp.einsum(subscripts, *operands)


def _seq(v, what):
    if not isinstance(v, tuple) or not v:
        raise TypeError(f"{what} needs a non-empty sequence of arrays")
    return list(v)


def _item(*arrays: Any) -> int:
    return max([a.dtype.itemsize for a in arrays if hasattr(a, "dtype")] + [8])


def _est_dot(args: tuple, kwargs: dict) -> int | None:
    a, b = args[0], args[1]
    if not (hasattr(a, "shape") and hasattr(b, "shape")):
        return None
    if a.ndim == 0 or b.ndim == 0:
        return max(a.size, b.size) * _item(a, b)
    if b.ndim == 1:
        shape = a.shape[:-1]
    else:
        shape = a.shape[:-1] + b.shape[:-2] + b.shape[-1:]
    return math.prod(shape) * _item(a, b)


def _est_inner(args: tuple, kwargs: dict) -> int | None:
    a, b = args[0], args[1]
    if not (hasattr(a, "shape") and hasattr(b, "shape")):
        return None
    if a.ndim == 0 or b.ndim == 0:
        return max(a.size, b.size) * _item(a, b)
    return math.prod(a.shape[:-1] + b.shape[:-1]) * _item(a, b)


def _est_tensordot(args: tuple, kwargs: dict) -> int | None:
    a, b = args[0], args[1]
    axes = args[2] if len(args) > 2 else kwargs.get("axes", 2)
    if not (hasattr(a, "shape") and hasattr(b, "shape")):
        return None
    if isinstance(axes, int) and not isinstance(axes, bool):
        if not 0 <= axes <= min(a.ndim, b.ndim):
            return None
        free = a.shape[:a.ndim - axes] + b.shape[axes:]
    elif isinstance(axes, tuple) and len(axes) == 2:
        ax_a, ax_b = ((x,) if isinstance(x, int) else x for x in axes)
        if not all(isinstance(i, int) and -n <= i < n for ax, n in ((ax_a, a.ndim), (ax_b, b.ndim)) for i in ax):
            return None
        ca, cb = {i % a.ndim for i in ax_a}, {i % b.ndim for i in ax_b}
        free = tuple(d for i, d in enumerate(a.shape) if i not in ca) + tuple(d for i, d in enumerate(b.shape) if i not in cb)
    else:
        return None
    return math.prod(free) * _item(a, b)


def _est_einsum(args: tuple, kwargs: dict) -> int | None:
    """Bytes of einsum's result from its subscripts and the operands' shapes; when the subscripts do
    not parse here, the product of the operands' sizes (an upper bound of any einsum's output)."""
    sub, operands = args[0], args[1:]
    if not isinstance(sub, str) or not all(hasattr(o, "shape") for o in operands):
        return None
    item = _item(*operands)
    try:
        text = sub.replace(" ", "")
        ins, out = text.split("->", 1) if "->" in text else (text, None)
        parts = ins.split(",")
        if len(parts) != len(operands):
            return None  # numpy raises the real error
        sizes: dict[str, int] = {}
        ell = []
        counts: dict[str, int] = {}
        for p, o in zip(parts, operands):
            shape = tuple(o.shape)
            if "..." in p:
                pre, post = p.split("...", 1)
                n = len(shape) - len(pre) - len(post)
                if n < 0:
                    return None
                ell.append(shape[len(pre):len(pre) + n])
                labels, dims = pre + post, shape[:len(pre)] + shape[len(shape) - len(post):]
            else:
                labels, dims = p, shape
            if len(labels) != len(dims) or not all(ch.isalpha() for ch in labels):
                raise ValueError(p)
            for ch, d in zip(labels, dims):
                sizes[ch] = max(sizes.get(ch, 1), d)
                counts[ch] = counts.get(ch, 0) + 1
        if out is None:
            out = "".join(sorted(ch for ch, c in counts.items() if c == 1))
        out = out.replace("...", "")
        if not all(ch in sizes for ch in out):
            return None
        ell_size = math.prod(np.broadcast_shapes(*ell)) if ell else 1
        return math.prod(sizes[ch] for ch in out) * ell_size * item
    except ValueError:
        return math.prod(o.size for o in operands) * item


def _est_join(args: tuple, kwargs: dict) -> int | None:
    arrays = args[0] if args else ()
    if not isinstance(arrays, tuple):
        return None
    return sum(a.size if hasattr(a, "size") else 1 for a in arrays) * _item(*arrays)


OPS.update(
    matmul=Op(lambda s, a, b: s.xp.matmul(a, b), frozenset(), _est_matmul),
    dot=Op(lambda s, a, b: s.xp.dot(a, b), frozenset(), _est_dot),
    tensordot=Op(lambda s, a, b, axes=2: s.xp.tensordot(a, b, axes=axes), frozenset({"axes"}), _est_tensordot),
    einsum=Op(_einsum, frozenset(), _est_einsum, frozenset({0})),
    outer=Op(lambda s, a, b: s.xp.outer(a, b), frozenset(), lambda a, k: a[0].size * a[1].size * _item(a[0], a[1])),
    inner=Op(lambda s, a, b: s.xp.inner(a, b), frozenset(), _est_inner),
    concatenate=Op(lambda s, arrays, axis=0: s.xp.concatenate(_seq(arrays, "concatenate"), axis=axis),
                   frozenset({"axis"}), _est_join),
    stack=Op(lambda s, arrays, axis=0: s.xp.stack(_seq(arrays, "stack"), axis=axis), frozenset({"axis"}), _est_join),
    where=Op(lambda s, c, x, y: s.xp.where(c, x, y), frozenset(), _est_broadcast),
    clip=Op(lambda s, a, lo, hi: s.xp.clip(a, lo, hi), frozenset(), _est_broadcast),
)


def lookup(name: Any) -> Op:
    """The Op for wire name `name`. Raises KeyError("unknown op 'x'") for anything else."""
    op = OPS.get(name) if isinstance(name, str) else None
    if op is None:
        raise KeyError(f"unknown op {name!r}" if isinstance(name, str) else f"op name must be a string, got {name!r}")
    return op
