"""CuPy's everyday names in gpuctl.remote (issue 14) against NumPy: hypothesis property tests over
shapes and dtypes, through a real NumPy-executor worker. Each result must equal NumPy's, and where
the shape does not depend on data the client must know shape and dtype before any round trip."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gpuctl.remote as cp
from remote_lease import attached, same

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
NUM_DTYPES = st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.int8, np.uint8])
FLOAT_DTYPES = st.sampled_from([np.float32, np.float64])


@pytest.fixture(scope="module")
def remote():
    with attached(quota_bytes=256 << 20):
        yield cp


def _elements(dt) -> st.SearchStrategy:
    dt = np.dtype(dt)
    if dt.kind == "f":
        return st.floats(-50, 50, width=32)
    return st.integers(0 if dt.kind == "u" else -50, 50)


def arrays(dtype=NUM_DTYPES, min_dims=1, max_dims=3, min_side=1, max_side=5):
    shapes = hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)
    return dtype.flatmap(lambda dt: hnp.arrays(dt, shapes, elements=_elements(dt)))


@SETTINGS
@given(a=arrays(), w=st.integers(0, 3), data=st.data())
def test_pad(remote, a, w, data):
    mode = data.draw(st.sampled_from(["constant", "edge", "wrap", "reflect", "symmetric"]))
    pw = data.draw(st.one_of(st.just(w), st.tuples(st.integers(0, 3), st.integers(0, 3)),
                             st.just(tuple((i % 3, (i + 1) % 2) for i in range(a.ndim)))))
    if mode == "constant":
        same(cp.pad(cp.asarray(a), pw, constant_values=7), np.pad(a, pw, constant_values=7))
    else:
        same(cp.pad(cp.asarray(a), pw, mode=mode), np.pad(a, pw, mode=mode))


@SETTINGS
@given(a=arrays(), reps=st.one_of(st.integers(0, 3), st.lists(st.integers(0, 3), min_size=1, max_size=4).map(tuple)))
def test_tile(remote, a, reps):
    same(cp.tile(cp.asarray(a), reps), np.tile(a, reps))


@SETTINGS
@given(a=arrays(), r=st.integers(0, 3), data=st.data())
def test_repeat(remote, a, r, data):
    axis = data.draw(st.one_of(st.none(), st.integers(-a.ndim, a.ndim - 1)))
    same(cp.repeat(cp.asarray(a), r, axis=axis), np.repeat(a, r, axis=axis))
    same(cp.asarray(a).repeat(r, axis), a.repeat(r, axis))
    reps = data.draw(st.lists(st.integers(0, 3), min_size=a.shape[axis or 0] if axis is not None else a.size,
                              max_size=a.shape[axis or 0] if axis is not None else a.size))
    same(cp.repeat(cp.asarray(a), reps, axis=axis), np.repeat(a, reps, axis=axis), inferred=False)


@SETTINGS
@given(a=arrays(min_side=2, max_side=6), data=st.data())
def test_split_flip_roll_moveaxis_rot90(remote, a, data):
    ax = data.draw(st.integers(-a.ndim, a.ndim - 1))
    n = a.shape[ax]
    k = data.draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
    ra = cp.asarray(a)
    same(cp.split(ra, k, axis=ax), np.split(a, k, axis=ax))
    same(cp.array_split(ra, 3, axis=ax), np.array_split(a, 3, axis=ax))
    same(cp.split(ra, [1, n - 1], axis=ax), np.split(a, [1, n - 1], axis=ax))
    same(cp.flip(ra, ax), np.flip(a, ax))
    same(cp.flip(ra), np.flip(a))
    shift = data.draw(st.integers(-7, 7))
    same(cp.roll(ra, shift), np.roll(a, shift))
    same(cp.roll(ra, shift, axis=ax), np.roll(a, shift, axis=ax))
    dst = data.draw(st.integers(-a.ndim, a.ndim - 1))
    same(cp.moveaxis(ra, ax, dst), np.moveaxis(a, ax, dst))
    if a.ndim >= 2:
        same(cp.rot90(ra), np.rot90(a))
        same(cp.fliplr(ra), np.fliplr(a))
    same(cp.flipud(ra), np.flipud(a))


@SETTINGS
@given(a=arrays(), data=st.data())
def test_take_and_take_along_axis(remote, a, data):
    ra = cp.asarray(a)
    idx = data.draw(st.lists(st.integers(0, a.size - 1), min_size=0, max_size=6))
    same(cp.take(ra, idx), np.take(a, idx))
    ax = data.draw(st.integers(-a.ndim, a.ndim - 1))
    idx2 = data.draw(st.lists(st.integers(0, a.shape[ax] - 1), min_size=1, max_size=4))
    same(cp.take(ra, idx2, axis=ax), np.take(a, idx2, axis=ax))
    same(ra.take(cp.asarray(np.array(idx2)), ax), a.take(idx2, ax))
    same(cp.take(ra, 0), np.take(a, 0))
    order = np.argsort(a, axis=ax)
    same(cp.take_along_axis(ra, cp.asarray(order), axis=ax), np.take_along_axis(a, order, axis=ax))


@SETTINGS
@given(a=arrays(max_dims=3))
def test_nonzero_where_count_nonzero(remote, a):
    ra = cp.asarray(a)
    m = a > 0
    same(cp.nonzero(ra > 0), np.nonzero(m), inferred=False)
    same(cp.where(ra > 0), np.where(m), inferred=False)
    same((ra > 0).nonzero(), m.nonzero(), inferred=False)
    same(cp.argwhere(ra), np.argwhere(a), inferred=False)
    same(cp.flatnonzero(ra), np.flatnonzero(a), inferred=False)
    same(cp.count_nonzero(ra), np.asarray(np.count_nonzero(a)))
    same(cp.count_nonzero(ra, axis=0), np.count_nonzero(a, axis=0))


@SETTINGS
@given(a=arrays(max_dims=1, max_side=12), v=arrays(max_dims=2), side=st.sampled_from(["left", "right"]))
def test_searchsorted(remote, a, v, side):
    s = np.sort(a)
    same(cp.searchsorted(cp.asarray(s), cp.asarray(v), side=side), np.searchsorted(s, v, side=side))


@SETTINGS
@given(a=arrays(max_dims=2, max_side=6), data=st.data())
def test_unique_family(remote, a, data):
    ra = cp.asarray(a)
    same(cp.unique(ra), np.unique(a), inferred=False)
    got = cp.unique(ra, return_index=True, return_inverse=True, return_counts=True)
    same(got, np.unique(a, return_index=True, return_inverse=True, return_counts=True), inferred=False)
    # sorted, as CuPy gives them (NumPy 2.3+'s array-API functions may leave them unordered)
    same(tuple(cp.unique_counts(ra)), np.unique(a, return_counts=True), inferred=False)
    v, inv = np.unique(a, return_inverse=True)
    same(tuple(cp.unique_inverse(ra)), (v, inv.reshape(a.shape)), inferred=False)
    v, idx, inv, cnt = np.unique(a, return_index=True, return_inverse=True, return_counts=True)
    same(tuple(cp.unique_all(ra)), (v, idx, inv.reshape(a.shape), cnt), inferred=False)
    same(cp.unique_values(ra), np.unique(a), inferred=False)


@SETTINGS
@given(a=arrays(min_dims=1, max_dims=2, max_side=6), k=st.integers(-3, 3))
def test_diag_trace_tril_triu(remote, a, k):
    ra = cp.asarray(a)
    same(cp.diag(ra, k), np.diag(a, k))
    if a.ndim == 2:
        same(cp.trace(ra, k), np.asarray(np.trace(a, k)))
        same(ra.trace(), np.asarray(a.trace()))
        same(cp.trace(ra, dtype=cp.float32), np.asarray(np.trace(a, dtype=np.float32)))
        same(cp.tril(ra, k), np.tril(a, k))
        same(cp.triu(ra, k), np.triu(a, k))
        same(ra.diagonal(k), a.diagonal(k))


@SETTINGS
@given(xs=st.lists(arrays(max_dims=1), min_size=1, max_size=3), indexing=st.sampled_from(["xy", "ij"]))
def test_meshgrid(remote, xs, indexing):
    same(cp.meshgrid(*[cp.asarray(x) for x in xs], indexing=indexing), np.meshgrid(*xs, indexing=indexing))


@SETTINGS
@given(a=arrays(), n=st.integers(0, 3), data=st.data())
def test_diff_cumprod(remote, a, n, data):
    ax = data.draw(st.integers(-a.ndim, a.ndim - 1))
    ra = cp.asarray(a)
    same(cp.diff(ra, n, axis=ax), np.diff(a, n, axis=ax))
    small = np.clip(a, -3, 3)
    same(cp.cumprod(cp.asarray(small), axis=ax), np.cumprod(small, axis=ax))
    same(cp.asarray(small).cumprod(), small.cumprod())


@SETTINGS
@given(a=arrays(FLOAT_DTYPES), data=st.data())
def test_percentile(remote, a, data):
    q = data.draw(st.one_of(st.floats(0, 100), st.lists(st.floats(0, 100), min_size=1, max_size=3)))
    axis = data.draw(st.one_of(st.none(), st.integers(-a.ndim, a.ndim - 1)))
    method = data.draw(st.sampled_from(["linear", "lower", "higher", "midpoint", "nearest"]))
    keep = data.draw(st.booleans())
    same(cp.percentile(cp.asarray(a), q, axis=axis, method=method, keepdims=keep),
         np.percentile(a, q, axis=axis, method=method, keepdims=keep), rtol=1e-5)


@SETTINGS
@given(a=arrays(), bins=st.integers(1, 12))
def test_histogram_bincount(remote, a, bins):
    same(cp.histogram(cp.asarray(a), bins), np.histogram(a, bins), rtol=1e-5)
    same(cp.histogram(cp.asarray(a), bins, range=(-10, 10)), np.histogram(a, bins, range=(-10, 10)), rtol=1e-5)
    x = np.abs(a.ravel()).astype(np.int64)
    same(cp.bincount(cp.asarray(x)), np.bincount(x), inferred=False)
    same(cp.bincount(cp.asarray(x), minlength=60), np.bincount(x, minlength=60), inferred=False)
    w = np.linspace(0, 1, x.size)
    same(cp.bincount(cp.asarray(x), weights=cp.asarray(w)), np.bincount(x, weights=w), inferred=False)


@SETTINGS
@given(a=arrays(FLOAT_DTYPES), eps=st.sampled_from([0.0, 1e-9, 1e-3]))
def test_allclose_array_equal(remote, a, eps):
    b = a + eps
    same(cp.allclose(cp.asarray(a), cp.asarray(b)), np.asarray(np.allclose(a, b)))
    same(cp.array_equal(cp.asarray(a), cp.asarray(b)), np.asarray(np.array_equal(a, b)))
    assert bool(cp.allclose(cp.asarray(a), cp.asarray(a)))


@SETTINGS
@given(a=arrays(), data=st.data())
def test_broadcast_to_arrays(remote, a, data):
    extra = data.draw(st.lists(st.integers(1, 3), max_size=2))
    shape = tuple(extra) + a.shape
    same(cp.broadcast_to(cp.asarray(a), shape), np.broadcast_to(a, shape))
    b = np.ones((1,) * a.ndim, np.float32)
    same(cp.broadcast_arrays(cp.asarray(a), cp.asarray(b)), np.broadcast_arrays(a, b))


@SETTINGS
@given(re=arrays(FLOAT_DTYPES, max_dims=2), decimals=st.integers(-1, 2))
def test_complex_parts_round_logaddexp_nan_to_num(remote, re, decimals):
    z = (re + 1j * re[::-1]).astype(np.complex64 if re.dtype == np.float32 else np.complex128)
    rz = cp.asarray(z)
    same(cp.real(rz), np.real(z))
    same(cp.imag(rz), np.imag(z))
    same(rz.real, z.real)
    same(rz.imag, z.imag)
    same(cp.conj(rz), np.conj(z))
    same(rz.conj(), z.conj())
    same(cp.real(cp.asarray(re)), np.real(re))
    same(cp.imag(cp.asarray(re)), np.imag(re))
    same(cp.round(cp.asarray(re), decimals), np.round(re, decimals))
    same(cp.around(cp.asarray(re), decimals), np.around(re, decimals))
    same(cp.asarray(re).round(decimals), re.round(decimals))
    same(cp.logaddexp(cp.asarray(re), cp.asarray(re[::-1])), np.logaddexp(re, re[::-1]), rtol=1e-5)
    bad = re.copy()
    bad.flat[0] = np.nan
    bad.flat[-1] = np.inf
    same(cp.nan_to_num(cp.asarray(bad)), np.nan_to_num(bad))
    same(cp.nan_to_num(cp.asarray(bad), nan=-1.0, posinf=9.0), np.nan_to_num(bad, nan=-1.0, posinf=9.0))


@SETTINGS
@given(a=arrays(), dtype=NUM_DTYPES, data=st.data())
def test_astype_asarray_copy_argmax_keepdims_mT(remote, a, dtype, data):
    ra = cp.asarray(a)
    same(cp.astype(ra, dtype), a.astype(dtype))
    assert cp.asarray(ra, copy=False) is ra
    c = cp.asarray(ra, copy=True)
    assert c is not ra and c.handle != ra.handle
    same(c, a)
    with pytest.raises(ValueError, match="Unable to avoid copy"):
        cp.asarray(a, copy=False)
    axis = data.draw(st.one_of(st.none(), st.integers(-a.ndim, a.ndim - 1)))
    same(cp.argmax(ra, axis=axis, keepdims=True), np.argmax(a, axis=axis, keepdims=True))
    same(ra.argmin(axis=axis, keepdims=True), a.argmin(axis=axis, keepdims=True))
    if a.ndim >= 2:
        same(ra.mT, a.mT)


@SETTINGS
@given(start=st.one_of(st.integers(-5, 5), st.floats(-5, 5).map(lambda v: round(v, 2))),
       stop=st.one_of(st.none(), st.integers(-5, 10), st.floats(-5, 10).map(lambda v: round(v, 2))),
       step=st.one_of(st.none(), st.sampled_from([1, 2, 0.5, -1, -0.25])))
def test_arange_dtype_and_length_equal_numpy(remote, start, stop, step):
    want = np.arange(start, stop, step) if stop is not None else np.arange(start)
    if step is not None and stop is None:
        return
    got = cp.arange(start, stop, step) if stop is not None else cp.arange(start)
    same(got, want)


def test_arange_float_stop_is_float64(remote):
    assert cp.arange(2.5).dtype == np.float64 and cp.arange(2.5).get().tolist() == [0.0, 1.0, 2.0]
    assert cp.arange(1, 2.5).dtype == np.float64 and cp.arange(1, 2.5).get().tolist() == [1.0, 2.0]


def test_finfo_iinfo_are_numpys(remote):
    assert cp.finfo(cp.float32).eps == np.finfo(np.float32).eps
    assert cp.iinfo(cp.int8).max == 127


def test_save_and_load_round_trip(remote, tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    path = tmp_path / "a.npy"
    cp.save(path, cp.asarray(a))
    np.testing.assert_array_equal(np.load(path), a)
    got = cp.load(path)
    assert isinstance(got, cp.ndarray)
    same(got, a)
    buf = io.BytesIO()
    np.savez(buf, x=a, y=a * 2)
    buf.seek(0)
    d = cp.load(buf)
    same(d["y"], a * 2)


def test_default_rng_equals_numpys_generator(remote):
    g = cp.random.default_rng(42)
    w = np.random.default_rng(42)
    same(g.random((2, 3)), w.random((2, 3)))
    same(g.standard_normal(4, dtype=cp.float32), w.standard_normal(4, dtype=np.float32))
    same(g.normal(1.0, 2.0, (2, 2)), w.normal(1.0, 2.0, (2, 2)))
    same(g.uniform(-1, 1, 3), w.uniform(-1, 1, 3))
    same(g.integers(0, 10, (5,)), w.integers(0, 10, (5,)))
    g2 = cp.random.default_rng(42)  # a second generator has its own state
    same(g2.random(3), np.random.default_rng(42).random(3))


def test_memory_pool_stream_and_mem_info(remote):
    pool = cp.get_default_memory_pool()
    base = pool.used_bytes()
    x = cp.zeros(1000)
    assert pool.used_bytes() == base + 8000
    assert pool.get_limit() == 256 << 20
    pool.free_all_blocks()
    with pytest.raises(ValueError, match="more than the lease's quota"):
        pool.set_limit(size=1 << 40)
    free, total = cp.cuda.Device().mem_info
    assert total == 256 << 20 and free == total - pool.used_bytes()
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        y = x + 1
    s.synchronize()
    assert s.done() and float(y[0]) == 1.0
    assert cp.get_default_pinned_memory_pool().used_bytes() == 0


def test_elementwise_kernel_needs_gpu(remote):
    k = cp.ElementwiseKernel("float32 x", "float32 y", "y = x * 2", "double_it")
    with pytest.raises(NotImplementedError, match=r"^ElementwiseKernel needs a GPU node"):
        k(cp.ones(3, dtype=cp.float32))
    conn = cp.get_connection()
    conn.enqueue("elementwise_kernel", [], ["float32 x", "float32 y", "y = x", "k", "", []])
    with pytest.raises(NotImplementedError, match=r"op #\d+ elementwise_kernel\(.*\): ElementwiseKernel needs a GPU"):
        cp.synchronize()


@SETTINGS
@given(a=arrays(max_dims=2), b=arrays(max_dims=2))
def test_stacking_and_shape_helpers(remote, a, b):
    ra = cp.asarray(a)
    same(cp.atleast_1d(ra), np.atleast_1d(a))
    same(cp.atleast_2d(ra), np.atleast_2d(a))
    same(cp.atleast_3d(ra), np.atleast_3d(a))
    same(cp.atleast_3d(cp.asarray(a[0, ...]) if a.ndim > 1 else cp.asarray(a)), np.atleast_3d(a[0, ...] if a.ndim > 1 else a))
    same(cp.append(ra, cp.asarray(b)), np.append(a, b))
    same(cp.ravel(ra), np.ravel(a))
    same(cp.copy(ra), np.copy(a))
    same(cp.diagflat(ra), np.diagflat(a))
    assert cp.ndim(ra) == a.ndim and cp.shape(ra) == a.shape and cp.size(ra) == a.size and cp.size(ra, 0) == a.shape[0]
    rb = cp.asarray(b)
    for name in ("vstack", "hstack", "column_stack", "dstack"):
        try:
            want = getattr(np, name)([a, b])
        except ValueError:
            with pytest.raises(ValueError):  # at the call, as NumPy and CuPy raise it
                getattr(cp, name)([ra, rb])
            continue
        same(getattr(cp, name)([ra, rb]), want)
    if a.shape == b.shape:
        same(cp.isclose(ra, cp.asarray(b)), np.isclose(a, b))
        same(cp.vdot(ra, cp.asarray(b)), np.asarray(np.vdot(a, b)), rtol=1e-4)
    if a.ndim == 2:
        same(cp.swapaxes(ra, 0, 1), np.swapaxes(a, 0, 1))


@SETTINGS
@given(n=st.integers(1, 6), m=st.one_of(st.none(), st.integers(1, 6)), k=st.integers(-2, 2),
       num=st.integers(1, 8), base=st.sampled_from([2.0, 10.0]))
def test_tri_logspace(remote, n, m, k, num, base):
    same(cp.tri(n, m, k), np.tri(n, m, k))
    same(cp.tri(n, m, k, dtype=cp.int32), np.tri(n, m, k, dtype=np.int32))
    same(cp.logspace(0, 2, num, base=base), np.logspace(0, 2, num, base=base), rtol=1e-6)


def test_dtype_routines_are_numpys(remote):
    assert cp.result_type(cp.ones(2, dtype=cp.float32).dtype, cp.int64) == np.result_type(np.float32, np.int64)
    assert cp.can_cast(cp.int8, cp.float32) and cp.promote_types(cp.int8, cp.uint8) == np.int16
    assert cp.issubdtype(cp.float32, cp.floating) and cp.isscalar(3.0) and cp.bool is np.bool_
