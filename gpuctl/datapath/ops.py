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
    "rint isnan isinf isfinite logical_not invert signbit conj conjugate"
).split()
BINARY_UFUNCS = (
    "add subtract multiply divide true_divide floor_divide remainder mod power float_power "
    "maximum minimum fmax fmin equal not_equal less less_equal greater greater_equal "
    "logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor left_shift "
    "right_shift arctan2 hypot copysign logaddexp logaddexp2"
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


# --------------------------------------------------------------------------------------------
# CuPy's everyday namespace beyond the basics (issue 14): linalg, fft, and the array helpers.
# Each op whose result can be larger than its inputs has an estimate (refused by the quota before
# allocating); the rest make results no larger than a small multiple of their inputs.


def _ints(v: Any, what: str) -> tuple[int, ...]:
    """An int or a tuple of ints (nested one level for pad widths flattened by the caller)."""
    vals = (v,) if isinstance(v, int) else v
    if not isinstance(vals, tuple) or not all(isinstance(x, int) and not isinstance(x, bool) for x in vals):
        raise TypeError(f"{what} must be an int or a tuple of ints, got {v!r}")
    return vals


def _bound(n: int, what: str) -> int:
    if n > DEFAULT_LIMITS.max_elements:
        raise ValueError(f"{what}: {n} elements (limit {DEFAULT_LIMITS.max_elements})")
    return n


def _pad_widths(a: Any, pad_width: Any) -> list[tuple[int, int]]:
    """numpy.pad's pad_width normalized to one (before, after) pair per axis of `a`."""
    pw = pad_width
    if isinstance(pw, int):
        pairs = [(pw, pw)] * a.ndim
    elif isinstance(pw, tuple) and pw and all(isinstance(x, int) for x in pw):
        if len(pw) == 1:
            pairs = [(pw[0], pw[0])] * a.ndim
        elif len(pw) == 2:
            pairs = [(pw[0], pw[1])] * a.ndim
        else:
            raise ValueError(f"pad: pad_width {pw!r} does not match {a.ndim} axes")
    elif isinstance(pw, tuple) and all(isinstance(x, tuple) for x in pw):
        if len(pw) == 1:
            pw = pw * a.ndim
        if len(pw) != a.ndim or not all(len(x) in (1, 2) and all(isinstance(i, int) for i in x) for x in pw):
            raise ValueError(f"pad: pad_width {pad_width!r} does not match {a.ndim} axes")
        pairs = [(x[0], x[-1]) for x in pw]
    else:
        raise TypeError(f"pad: pad_width must be ints, got {pad_width!r}")
    if any(b < 0 or e < 0 for b, e in pairs):
        raise ValueError("pad: index can't contain negative values")
    return pairs


def _pad(s, a, pad_width, mode="constant", constant_values=0):
    if mode not in ("constant", "edge", "reflect", "symmetric", "wrap"):
        raise ValueError(f"pad: mode {mode!r} is not supported (constant, edge, reflect, symmetric, wrap)")
    pairs = _pad_widths(a, pad_width)
    _bound(math.prod(d + b + e for d, (b, e) in zip(a.shape, pairs)), "pad")
    if mode == "constant":
        return s.xp.pad(a, pairs, mode=mode, constant_values=constant_values)
    return s.xp.pad(a, pairs, mode=mode)


def _est_pad(args, kwargs):
    a = args[0]
    pairs = _pad_widths(a, args[1])
    return math.prod(d + b + e for d, (b, e) in zip(a.shape, pairs)) * a.dtype.itemsize


def _tile_shape(a: Any, reps: Any) -> tuple[int, ...]:
    reps = _ints(reps, "tile: reps")
    if any(r < 0 for r in reps):
        raise ValueError("tile: negative reps")
    n = max(a.ndim, len(reps))
    shape = (1,) * (n - a.ndim) + tuple(a.shape)
    reps = (1,) * (n - len(reps)) + reps
    return tuple(d * r for d, r in zip(shape, reps))


def _tile(s, a, reps):
    _bound(math.prod(_tile_shape(a, reps)), "tile")
    return s.xp.tile(a, reps)


def _repeat_len(a: Any, repeats: Any, axis: Any) -> int:
    if isinstance(repeats, int) and not isinstance(repeats, bool):
        if repeats < 0:
            raise ValueError("repeat: negative repeats")
        return a.size * repeats
    if hasattr(repeats, "shape"):
        return a.size * max(1, repeats.size)  # an upper bound needs the values: checked by the result
    raise TypeError(f"repeat: repeats must be an int or an integer array, got {repeats!r}")


def _repeat(s, a, repeats, axis=None):
    """numpy.repeat with the result's element count bounded before it is made (an array of
    repeats is summed on the device first: one sync on GPU nodes)."""
    if axis is not None and (type(axis) is not int or not -max(a.ndim, 1) <= axis < max(a.ndim, 1)):
        raise ValueError(f"repeat: axis {axis!r} is out of bounds for an array of dimension {a.ndim}")
    if isinstance(repeats, int) and not isinstance(repeats, bool):
        _bound(_repeat_len(a, repeats, axis), "repeat")
    elif hasattr(repeats, "shape"):
        if repeats.dtype.kind not in "iu":
            raise TypeError("repeat: repeats must be integers")
        if repeats.size == 1:
            n = a.size * int(repeats.reshape(-1)[0])
        else:
            rest = 1 if axis is None else a.size // max(1, a.shape[axis])
            n = int(repeats.sum()) * rest
        _bound(n, "repeat")
    else:
        raise TypeError(f"repeat: repeats must be an int or an integer array, got {repeats!r}")
    return s.xp.repeat(a, repeats, axis=axis)


def _nonzero(s, a):
    if a.ndim > 8:
        raise ValueError("nonzero: arrays of more than 8 dimensions are not supported by gpuctl.remote")
    return tuple(s.xp.nonzero(a))


def _unique(s, a, return_index=False, return_inverse=False, return_counts=False, axis=None):
    if axis is not None:
        raise NotImplementedError("unique: axis= is not supported by gpuctl.remote (nor by CuPy before 14)")
    return s.xp.unique(a, return_index=bool(return_index), return_inverse=bool(return_inverse),
                       return_counts=bool(return_counts))


def _searchsorted(s, a, v, side="left"):
    if side not in ("left", "right"):
        raise ValueError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
    return s.xp.searchsorted(a, v, side=side)


def _diag(s, v, k=0):
    if v.ndim == 1:
        _bound((v.shape[0] + abs(k)) ** 2, "diag")
    return s.xp.diag(v, k)


def _meshgrid(s, *xi, indexing="xy"):
    if indexing not in ("xy", "ij"):
        raise ValueError(f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}")
    if not 1 <= len(xi) <= 8:
        raise ValueError("meshgrid: 1 to 8 arrays")
    _bound(math.prod(x.size for x in xi), "meshgrid")
    return tuple(s.xp.meshgrid(*xi, indexing=indexing))


def _est_meshgrid(args, kwargs):
    if not all(hasattr(x, "size") for x in args):
        return None
    return len(args) * math.prod(x.size for x in args) * _item(*args)


def _percentile(s, a, q, axis=None, keepdims=False, method="linear"):
    if method not in ("linear", "lower", "higher", "midpoint", "nearest"):
        raise ValueError(f"percentile: method {method!r} is not supported")
    return s.xp.percentile(a, q, axis=axis, keepdims=keepdims, method=method)


def _histogram(s, a, bins=10, range=None):
    if isinstance(bins, int):
        if not 1 <= bins <= DEFAULT_LIMITS.max_seq * 256:
            raise ValueError(f"histogram: bins must be 1..{DEFAULT_LIMITS.max_seq * 256}, got {bins}")
    elif not hasattr(bins, "shape"):
        raise TypeError("histogram: bins must be an int or an array of bin edges")
    return tuple(s.xp.histogram(a, bins=bins, range=range))


def _bincount(s, x, weights=None, minlength=0):
    if x.dtype.kind not in "iub":
        raise TypeError(f"bincount: x must hold integers, got {x.dtype}")
    top = int(x.max()) + 1 if x.size else 0  # needs the values: one device sync on GPU nodes
    _bound(max(top, int(minlength)), "bincount")
    return s.xp.bincount(x, weights=weights, minlength=minlength)


def _allclose(s, a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    return s.xp.asarray(s.xp.allclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan))


def _array_equal(s, a1, a2, equal_nan=False):
    return s.xp.asarray(s.xp.array_equal(a1, a2, equal_nan=equal_nan))


def _nan_to_num(s, x, copy=True, nan=0.0, posinf=None, neginf=None):
    return s.xp.nan_to_num(x, copy=True, nan=nan, posinf=posinf, neginf=neginf)


def _est_same(args, kwargs):
    a = args[0]
    return a.nbytes if hasattr(a, "nbytes") else None


def _est_fft(real_out: bool = False, inverse_real: bool = False):
    """Bytes of an fft result: the input's size with the transformed axis' length replaced by n
    (or s), as complex128 (an upper bound for every dtype)."""

    def est(args, kwargs):
        a = args[0]
        n = args[1] if len(args) > 1 else kwargs.get("n", kwargs.get("s"))
        size = a.size
        if isinstance(n, int) and not isinstance(n, bool):
            last = a.shape[-1] if a.ndim else 1
            size = (size // max(last, 1)) * n if last else n
        elif isinstance(n, tuple) and all(isinstance(x, int) for x in n):
            size = math.prod(n) * max(1, a.size // max(1, math.prod(a.shape[-len(n):]) if n else 1))
        return _bound(size + 1, "fft") * 16

    return est


def _check_fft_norm(norm: Any) -> None:
    if norm not in (None, "backward", "ortho", "forward"):
        raise ValueError(f"fft: norm must be None, 'backward', 'ortho' or 'forward', got {norm!r}")


def _fft(name: str, axes_kw: str):
    if axes_kw == "axis":
        def fn(session, a, n=None, axis=-1, norm=None):
            _check_fft_norm(norm)
            return getattr(session.xp.fft, name)(a, n=n, axis=axis, norm=norm)
    else:
        def fn(session, a, s=None, axes=None, norm=None):
            _check_fft_norm(norm)
            if s is not None:
                _bound(math.prod(_ints(s, "fft: s")), "fft")
            return getattr(session.xp.fft, name)(a, s=s, axes=axes, norm=norm)
    return fn


def _fftfreq(name: str):
    def fn(s, n, d=1.0):
        if not isinstance(n, int) or not 0 < n <= DEFAULT_LIMITS.max_elements:
            raise ValueError(f"{name}: n must be a positive int, got {n!r}")
        return getattr(s.xp.fft, name)(n, d)

    return fn


def _linalg(name: str, argnames: tuple[str, ...] = ()):
    def fn(s, a, *rest, **kwargs):
        return getattr(s.xp.linalg, name)(a, *rest, **kwargs)

    return fn


def _norm(s, x, ord=None, axis=None, keepdims=False):
    return s.xp.asarray(s.xp.linalg.norm(x, ord=ord, axis=axis, keepdims=keepdims))


def _svd(s, a, full_matrices=True, compute_uv=True):
    r = s.xp.linalg.svd(a, full_matrices=bool(full_matrices), compute_uv=bool(compute_uv))
    return tuple(r) if compute_uv else r


def _est_svd(args, kwargs):
    a = args[0]
    full = args[1] if len(args) > 1 else kwargs.get("full_matrices", True)
    if a.ndim < 2:
        return None
    m, n = a.shape[-2], a.shape[-1]
    batch = math.prod(a.shape[:-2])
    k = min(m, n)
    per = (m * m + n * n + k) if full else (m * k + k * n + k)
    return batch * per * max(a.dtype.itemsize, 8)


def _qr(s, a, mode="reduced"):
    if mode not in ("reduced", "complete", "r", "raw"):
        raise ValueError(f"qr: mode {mode!r} is not supported")
    r = s.xp.linalg.qr(a, mode=mode)
    return tuple(r) if isinstance(r, tuple) or mode != "r" else r


def _eigh(s, a, UPLO="L"):
    if UPLO not in ("L", "U"):
        raise ValueError(f"eigh: UPLO must be 'L' or 'U', got {UPLO!r}")
    return tuple(s.xp.linalg.eigh(a, UPLO=UPLO))


def _slogdet(s, a):
    return tuple(s.xp.linalg.slogdet(a))


def _generator(s, gid):
    gens = s.__dict__.setdefault("_generators", {})
    g = gens.get(gid) if type(gid) is int else None
    if g is None:
        raise ValueError(f"random generator g{gid!r} does not exist on this connection")
    return g


def _gen_new(s, gid, seed=None):
    if type(gid) is not int or gid < 0:
        raise TypeError("generator id must be a non-negative int")
    if seed is not None and (type(seed) is not int or not 0 <= seed < 2**64):
        raise ValueError(f"random seed must be an integer in [0, 2**64), got {seed!r}")
    gens = s.__dict__.setdefault("_generators", {})
    if gid not in gens and len(gens) >= 256:
        raise ValueError("too many random generators on this connection (limit 256)")
    gens[gid] = s.xp.random.default_rng(seed)


def _gen_float_dtype(dtype):
    d = _dt(dtype) or "float64"
    if d not in ("float32", "float64"):
        raise TypeError(f"Generator: dtype must be float32 or float64, got {d}")
    return d


OPS.update(
    # linear algebra (numpy.linalg on simulated nodes, cupy.linalg on GPU nodes)
    linalg_norm=Op(_norm, frozenset({"ord", "axis", "keepdims"}), None, frozenset({1, "ord"})),
    linalg_solve=Op(lambda s, a, b: s.xp.linalg.solve(a, b), frozenset(), lambda a, k: a[1].nbytes * 2),
    linalg_inv=Op(lambda s, a: s.xp.linalg.inv(a), frozenset(), lambda a, k: a[0].nbytes * 2),
    linalg_pinv=Op(lambda s, a: s.xp.linalg.pinv(a), frozenset(), lambda a, k: a[0].nbytes * 2),
    linalg_det=Op(lambda s, a: s.xp.asarray(s.xp.linalg.det(a))),
    linalg_slogdet=Op(_slogdet),
    linalg_cholesky=Op(lambda s, a: s.xp.linalg.cholesky(a), frozenset(), lambda a, k: a[0].nbytes * 2),
    linalg_qr=Op(_qr, frozenset({"mode"}), lambda a, k: a[0].nbytes * 3, frozenset({1, "mode"})),
    linalg_svd=Op(_svd, frozenset({"full_matrices", "compute_uv"}), _est_svd),
    linalg_eigh=Op(_eigh, frozenset({"UPLO"}), lambda a, k: a[0].nbytes * 2, frozenset({1, "UPLO"})),
    linalg_eigvalsh=Op(lambda s, a, UPLO="L": s.xp.linalg.eigvalsh(a, UPLO=UPLO), frozenset({"UPLO"}), None,
                       frozenset({1, "UPLO"})),
    linalg_matrix_rank=Op(lambda s, a: s.xp.asarray(s.xp.linalg.matrix_rank(a))),
    # FFT
    **{f"fft_{n}": Op(_fft(n, "axis"), frozenset({"n", "axis", "norm"}), _est_fft(), frozenset({3, "norm"}))
       for n in ("fft", "ifft", "rfft", "irfft")},
    **{f"fft_{n}": Op(_fft(n, "axes"), frozenset({"s", "axes", "norm"}), _est_fft(), frozenset({3, "norm"}))
       for n in ("fft2", "ifft2", "fftn", "ifftn", "rfftn", "irfftn")},
    fft_fftfreq=Op(_fftfreq("fftfreq"), frozenset({"d"}), lambda a, k: 8 * a[0] if isinstance(a[0], int) else None),
    fft_rfftfreq=Op(_fftfreq("rfftfreq"), frozenset({"d"}), lambda a, k: 8 * a[0] if isinstance(a[0], int) else None),
    fft_fftshift=Op(lambda s, x, axes=None: s.xp.fft.fftshift(x, axes=axes), frozenset({"axes"}), _est_same),
    fft_ifftshift=Op(lambda s, x, axes=None: s.xp.fft.ifftshift(x, axes=axes), frozenset({"axes"}), _est_same),
    # shape and order
    pad=Op(_pad, frozenset({"mode", "constant_values"}), _est_pad, frozenset({2, "mode"})),
    tile=Op(_tile, frozenset(), lambda a, k: math.prod(_tile_shape(a[0], a[1])) * a[0].dtype.itemsize),
    repeat=Op(_repeat, frozenset({"axis"}),
              lambda a, k: _repeat_len(a[0], a[1], None) * a[0].dtype.itemsize if isinstance(a[1], int) else None),
    roll=Op(lambda s, a, shift, axis=None: s.xp.roll(a, shift, axis=axis), frozenset({"axis"}), _est_same),
    rot90=Op(lambda s, a, k=1, axes=(0, 1): s.xp.rot90(a, k, axes), frozenset(), None),
    take=Op(lambda s, a, indices, axis=None: s.xp.take(a, indices, axis=axis), frozenset({"axis"}),
            lambda a, k: (a[1].size if hasattr(a[1], "size") else 1) * a[0].size // max(1, (a[0].shape[k["axis"]] if k.get("axis") is not None else a[0].size)) * a[0].dtype.itemsize),
    take_along_axis=Op(lambda s, a, indices, axis: s.xp.take_along_axis(a, indices, axis), frozenset(),
                       lambda a, k: a[1].size * a[0].dtype.itemsize if hasattr(a[1], "size") else None),
    nonzero=Op(_nonzero, frozenset(), lambda a, k: a[0].size * max(1, a[0].ndim) * 8),
    argwhere=Op(lambda s, a: s.xp.argwhere(a), frozenset(), lambda a, k: a[0].size * max(1, a[0].ndim) * 8),
    flatnonzero=Op(lambda s, a: s.xp.flatnonzero(a), frozenset(), lambda a, k: a[0].size * 8),
    unique=Op(_unique, frozenset({"return_index", "return_inverse", "return_counts", "axis"}),
              lambda a, k: a[0].size * 8 * 4),
    searchsorted=Op(_searchsorted, frozenset({"side"}),
                    lambda a, k: (a[1].size if hasattr(a[1], "size") else 1) * 8, frozenset({2, "side"})),
    diag=Op(_diag, frozenset({"k"}),
            lambda a, k: ((a[0].shape[0] + abs(a[1] if len(a) > 1 else k.get("k", 0))) ** 2 * a[0].dtype.itemsize
                          if a[0].ndim == 1 else None)),
    diagonal=Op(lambda s, a, offset=0, axis1=0, axis2=1: s.xp.diagonal(a, offset, axis1, axis2)),
    trace=Op(lambda s, a, offset=0, axis1=0, axis2=1, dtype=None: s.xp.trace(a, offset, axis1, axis2, dtype=_dt(dtype)),
             frozenset({"dtype"}), None, frozenset({"dtype"})),
    tril=Op(lambda s, m, k=0: s.xp.tril(m, k), frozenset(), _est_same),
    triu=Op(lambda s, m, k=0: s.xp.triu(m, k), frozenset(), _est_same),
    meshgrid=Op(_meshgrid, frozenset({"indexing"}), _est_meshgrid, frozenset({"indexing"})),
    diff=Op(lambda s, a, n=1, axis=-1: s.xp.diff(a, n=n, axis=axis), frozenset(), lambda a, k: a[0].size * 8),
    percentile=Op(_percentile, frozenset({"axis", "keepdims", "method"}),
                  lambda a, k: a[0].size * 8 * max(1, a[1].size if hasattr(a[1], "size") else
                                                   (len(a[1]) if isinstance(a[1], tuple) else 1)),
                  frozenset({"method"})),
    histogram=Op(_histogram, frozenset({"bins", "range"}), None),
    bincount=Op(_bincount, frozenset({"weights", "minlength"}), None),
    allclose=Op(_allclose, frozenset({"rtol", "atol", "equal_nan"})),
    array_equal=Op(_array_equal, frozenset({"equal_nan"})),
    real=Op(lambda s, a: s.xp.real(a)),
    imag=Op(lambda s, a: s.xp.imag(a), frozenset(), _est_same),
    around=Op(lambda s, a, decimals=0: s.xp.around(a, decimals), frozenset(), _est_same),
    nan_to_num=Op(_nan_to_num, frozenset({"copy", "nan", "posinf", "neginf"}), _est_same),
    # numpy.random.Generator / cupy.random.Generator (one per id per connection)
    gen_new=Op(_gen_new),
    gen_random=Op(lambda s, g, size=None, dtype="float64": _generator(s, g).random(_size(size), dtype=_gen_float_dtype(dtype)),
                  frozenset({"dtype"}), _est_size(1), frozenset({2, "dtype"})),
    gen_standard_normal=Op(lambda s, g, size=None, dtype="float64":
                           _generator(s, g).standard_normal(_size(size), dtype=_gen_float_dtype(dtype)),
                           frozenset({"dtype"}), _est_size(1), frozenset({2, "dtype"})),
    gen_normal=Op(lambda s, g, loc=0.0, scale=1.0, size=None: _generator(s, g).normal(loc, scale, _size(size)),
                  frozenset(), _est_size(3)),
    gen_uniform=Op(lambda s, g, low=0.0, high=1.0, size=None: _generator(s, g).uniform(low, high, _size(size)),
                   frozenset(), _est_size(3)),
    gen_integers=Op(lambda s, g, low, high=None, size=None, dtype="int64":
                    _generator(s, g).integers(low, high, _size(size), dtype=_dt(dtype)),
                    frozenset(), _est_size(3), frozenset({4})),
)
OPS["isclose"] = Op(lambda s, a, b, rtol=1e-05, atol=1e-08, equal_nan=False:
                   s.xp.isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan),
                   frozenset({"rtol", "atol", "equal_nan"}), lambda a, k: _est_broadcast(a[:2], k))
OPS["elementwise_kernel"] = Op(
    lambda s, in_params, out_params, operation, name, preamble, arrays:
    s.executor.elementwise_kernel(in_params, out_params, operation, name, preamble, arrays),
    frozenset(), None, frozenset({0, 1, 2, 3, 4}))
OPS["argmax"] = Op(_reduction("argmax"), frozenset({"keepdims"}), None, frozenset({"dtype"}))
OPS["argmin"] = Op(_reduction("argmin"), frozenset({"keepdims"}), None, frozenset({"dtype"}))


def lookup(name: Any) -> Op:
    """The Op for wire name `name`. Raises KeyError("unknown op 'x'") for anything else."""
    op = OPS.get(name) if isinstance(name, str) else None
    if op is None:
        raise KeyError(f"unknown op {name!r}" if isinstance(name, str) else f"op name must be a string, got {name!r}")
    return op
