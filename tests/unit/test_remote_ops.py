"""gpuctl.remote against a NumPy-executor worker: every client op equals NumPy's result; queued
errors name their op; quota; GC frees; RawKernel refusal; memGetInfo."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import gpuctl.remote as cp
from remote_lease import attached

RNG = np.random.default_rng(7)
A0 = RNG.standard_normal((3, 4)).astype(np.float32)
B0 = RNG.standard_normal((3, 4)).astype(np.float32)
I0 = np.arange(12, dtype=np.int64).reshape(3, 4)


@pytest.fixture(scope="module")
def remote():
    with attached(quota_bytes=256 << 20):
        yield cp


def _setitem(xp, A, B, I):
    C = A.copy()
    C[1:, 2] = 5
    C[0] = B[0]
    C[2, [0, 1]] = -1
    return C


def _inplace(xp, A, B, I):
    C = A.copy()
    C += 1
    C *= B
    C -= 2
    C /= 3
    J = I.copy()
    J //= 2
    J %= 5
    return C, J


def _view_write(xp, A, B, I):
    C = A.copy()
    v = C[1:]
    v += 100
    C[:, ::2] *= -1
    return C


def _seeded(kind):
    def f(xp, A, B, I):
        xp.random.seed(1234)
        return {
            "rand": lambda: xp.random.rand(2, 3),
            "randn": lambda: xp.random.randn(4),
            "random_sample": lambda: xp.random.random_sample((2, 2)),
            "normal": lambda: xp.random.normal(1.0, 2.0, (3, 2)),
            "uniform": lambda: xp.random.uniform(-1.0, 1.0, 5),
            "randint": lambda: xp.random.randint(0, 10, (2, 5)),
        }[kind]()

    return f


CASES = {
    # arithmetic and comparison operators
    "add": lambda xp, A, B, I: A + B,
    "sub": lambda xp, A, B, I: A - B,
    "mul": lambda xp, A, B, I: A * B,
    "truediv": lambda xp, A, B, I: A / (B * B + 1),
    "floordiv": lambda xp, A, B, I: I // 3,
    "mod": lambda xp, A, B, I: I % 5,
    "pow": lambda xp, A, B, I: abs(A) ** 1.5,
    "radd_scalar": lambda xp, A, B, I: 2 + A,
    "rsub_scalar": lambda xp, A, B, I: 1.5 - A,
    "rtruediv": lambda xp, A, B, I: 1 / (A * A + 1),
    "int_plus_float": lambda xp, A, B, I: I + 0.5,
    "int_true_div": lambda xp, A, B, I: I / 4,
    "neg": lambda xp, A, B, I: -A,
    "abs": lambda xp, A, B, I: abs(A),
    "eq": lambda xp, A, B, I: I == 3,
    "ne": lambda xp, A, B, I: I != 3,
    "lt": lambda xp, A, B, I: A < B,
    "le": lambda xp, A, B, I: A <= B,
    "gt": lambda xp, A, B, I: A > 0,
    "ge": lambda xp, A, B, I: A >= B,
    "and": lambda xp, A, B, I: I & 6,
    "broadcast_row": lambda xp, A, B, I: A + B[0],
    "broadcast_col": lambda xp, A, B, I: A * B[:, :1],
    # linear algebra
    "matmul": lambda xp, A, B, I: A @ B.T,
    "matmul_vec": lambda xp, A, B, I: A @ B[0],
    "dot": lambda xp, A, B, I: xp.dot(A.T, B),
    "method_dot": lambda xp, A, B, I: A.dot(B.T),
    "tensordot": lambda xp, A, B, I: xp.tensordot(A, B, axes=([1], [1])),
    "einsum": lambda xp, A, B, I: xp.einsum("ij,kj->ik", A, B),
    "outer": lambda xp, A, B, I: xp.outer(A[0], B[1]),
    # elementwise functions
    "exp": lambda xp, A, B, I: xp.exp(A),
    "log": lambda xp, A, B, I: xp.log(A * A + 1),
    "sqrt": lambda xp, A, B, I: xp.sqrt(abs(A)),
    "tanh": lambda xp, A, B, I: xp.tanh(A),
    "absolute": lambda xp, A, B, I: xp.abs(A),
    "maximum": lambda xp, A, B, I: xp.maximum(A, B),
    "maximum_scalar": lambda xp, A, B, I: xp.maximum(A, 0),
    "minimum": lambda xp, A, B, I: xp.minimum(A, B),
    "where": lambda xp, A, B, I: xp.where(A > 0, A, B),
    "where_scalar": lambda xp, A, B, I: xp.where(A > 0, A, 0.0),
    "clip": lambda xp, A, B, I: xp.clip(A, -0.5, 0.5),
    "method_clip": lambda xp, A, B, I: A.clip(-0.1, 0.2),
    # reductions with axis
    **{f"{r}_axis{ax}": (lambda r, ax: lambda xp, A, B, I: getattr(A, r)(axis=ax))(r, ax)
       for r in ("sum", "mean", "max", "min", "argmax", "argmin", "var", "std") for ax in (None, 0, 1, -1)},
    "sum_keepdims": lambda xp, A, B, I: A.sum(axis=1, keepdims=True),
    "sum_tuple_axis": lambda xp, A, B, I: A.sum(axis=(0, 1)),
    "module_sum": lambda xp, A, B, I: xp.sum(I, axis=0),
    "module_mean": lambda xp, A, B, I: xp.mean(A, axis=1),
    "module_max": lambda xp, A, B, I: xp.max(A, axis=0),
    "module_argmin": lambda xp, A, B, I: xp.argmin(A, axis=1),
    "std_ddof": lambda xp, A, B, I: A.std(axis=0, ddof=1),
    "sum_int_dtype": lambda xp, A, B, I: I.sum(dtype=xp.float32),
    "cumsum": lambda xp, A, B, I: I.cumsum(axis=1),
    "any_all": lambda xp, A, B, I: xp.stack([(A > 0).any(axis=0), (A > -5).all(axis=0)]),
    # joining
    "concatenate0": lambda xp, A, B, I: xp.concatenate([A, B]),
    "concatenate1": lambda xp, A, B, I: xp.concatenate([A, B], axis=1),
    "stack0": lambda xp, A, B, I: xp.stack([A, B]),
    "stack2": lambda xp, A, B, I: xp.stack([A, B], axis=2),
    # ndarray methods
    "astype": lambda xp, A, B, I: A.astype(xp.float64) * 3,
    "astype_int": lambda xp, A, B, I: (A * 10).astype(xp.int32),
    "reshape": lambda xp, A, B, I: A.reshape(2, 6),
    "reshape_minus1": lambda xp, A, B, I: A.reshape(-1, 3),
    "reshape_tuple": lambda xp, A, B, I: A.reshape((4, 3)),
    "transpose": lambda xp, A, B, I: A.transpose(),
    "transpose_axes": lambda xp, A, B, I: A.reshape(1, 3, 4).transpose(2, 0, 1),
    "T": lambda xp, A, B, I: A.T,
    "copy": lambda xp, A, B, I: A.copy(),
    "ravel": lambda xp, A, B, I: A.ravel(),
    "flatten": lambda xp, A, B, I: A.flatten(),
    "squeeze": lambda xp, A, B, I: A.reshape(1, 3, 1, 4).squeeze(),
    "expand_dims": lambda xp, A, B, I: xp.expand_dims(A, 1),
    "swapaxes": lambda xp, A, B, I: A.swapaxes(0, 1),
    # indexing and slicing
    "index_int": lambda xp, A, B, I: A[1],
    "index_neg": lambda xp, A, B, I: A[-1, -2],
    "slice": lambda xp, A, B, I: A[1:3, ::2],
    "slice_neg_step": lambda xp, A, B, I: A[::-1, 1:],
    "ellipsis": lambda xp, A, B, I: A[..., 1],
    "newaxis": lambda xp, A, B, I: A[None, 1],
    "bool_mask": lambda xp, A, B, I: A[A > 0],
    "fancy_list": lambda xp, A, B, I: A[[0, 2]],
    "fancy_array": lambda xp, A, B, I: A[:, I[0, :2]],
    "setitem": _setitem,
    "inplace": _inplace,
    "view_write": _view_write,
    # creation
    "zeros": lambda xp, A, B, I: xp.zeros((2, 3)),
    "ones_int": lambda xp, A, B, I: xp.ones(4, dtype=xp.int32),
    "full": lambda xp, A, B, I: xp.full((2, 2), 7),
    "full_float": lambda xp, A, B, I: xp.full((2,), 1.5, dtype=xp.float32),
    "arange": lambda xp, A, B, I: xp.arange(10),
    "arange_float": lambda xp, A, B, I: xp.arange(1, 2, 0.25),
    "arange_dtype": lambda xp, A, B, I: xp.arange(0, 12, 3, dtype=xp.float32),
    "linspace": lambda xp, A, B, I: xp.linspace(0, 1, 5),
    "eye": lambda xp, A, B, I: xp.eye(3, 4, 1),
    "zeros_like": lambda xp, A, B, I: xp.zeros_like(A),
    "ones_like": lambda xp, A, B, I: xp.ones_like(I, dtype=xp.float64),
    "full_like": lambda xp, A, B, I: xp.full_like(A, 2.5),
    "array_list": lambda xp, A, B, I: xp.array([[1, 2], [3, 4]]),
    "asarray_dtype": lambda xp, A, B, I: xp.asarray([1.5, 2.5], dtype=xp.float16),
    "numpy_operand": lambda xp, A, B, I: A + np.ones(4, np.float32),
    # random with seeds (the NumPy executor uses the legacy RandomState: equals local np.random)
    **{f"random_{k}": _seeded(k) for k in ("rand", "randn", "random_sample", "normal", "uniform", "randint")},
}


def _host(x):
    if isinstance(x, tuple):
        return tuple(_host(v) for v in x)
    return cp.asnumpy(x)


@pytest.mark.parametrize("case", sorted(CASES))
def test_op_equals_numpy(remote, case):
    fn = CASES[case]
    want = fn(np, A0.copy(), B0.copy(), I0.copy())
    got_remote = fn(cp, cp.asarray(A0), cp.asarray(B0), cp.asarray(I0))
    items = list(zip(got_remote, want)) if isinstance(want, tuple) else [(got_remote, want)]
    for g, w in items:
        w = np.asarray(w)
        assert isinstance(g, cp.ndarray)
        # the client's own idea of shape/dtype (inferred without a round trip) must be right
        assert g.shape == w.shape, case
        assert g.dtype == w.dtype, case
        assert g.ndim == w.ndim and g.size == w.size and g.nbytes == w.nbytes
        host = g.get()
        assert host.dtype == w.dtype and host.shape == w.shape
        np.testing.assert_allclose(host, w, rtol=1e-6, atol=1e-6, err_msg=case)


def test_empty_and_attributes(remote):
    e = cp.empty((2, 5), dtype=cp.float16)
    assert (e.shape, e.dtype, e.size, e.nbytes, e.ndim, e.itemsize) == ((2, 5), np.float16, 10, 20, 2, 2)
    assert e.get().shape == (2, 5)
    a = cp.asarray(A0)
    assert a.T.shape == (4, 3) and len(a) == 3
    assert [r.get().tolist() for r in a] == A0.tolist()


def test_scalar_conversions(remote):
    a = cp.asarray(I0)
    assert float(a.sum()) == 66.0
    assert int(a[1, 1]) == 5
    assert bool(a[0, 0] == 0) is True
    assert a.max().item() == 11
    assert list(range(10))[a[0, 3]] == 3  # __index__
    assert cp.asnumpy(a).tolist() == I0.tolist()
    assert repr(cp.asarray(np.array([1.0, 2.0]))) == "array([1., 2.])"


def test_implicit_numpy_conversion_refused_like_cupy(remote):
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
        np.asarray(cp.ones(3))


def test_numpy_array_on_left_defers_to_remote(remote):
    r = np.ones(4, np.float32) * cp.asarray(A0)
    assert isinstance(r, cp.ndarray)
    np.testing.assert_allclose(r.get(), A0)


def test_get_into_out_buffer(remote):
    out = np.empty((3, 4), np.float32)
    got = cp.asarray(A0).get(out=out)
    assert got is out and np.array_equal(out, A0)


def test_shape_error_raises_at_the_call_like_cupy(remote):
    a = cp.asarray(np.ones((3, 4), np.float32))
    b = cp.asarray(np.ones((5, 6), np.float32))
    sent = cp.get_connection().ops_sent + len(cp.get_connection()._ops)
    with pytest.raises(ValueError, match=r"matmul: Input operand 1 has a mismatch in its core dimension 0"):
        a @ b
    assert cp.get_connection().ops_sent + len(cp.get_connection()._ops) == sent  # nothing queued
    assert float(a.sum()) == 12.0  # state unchanged, usable


def test_value_dependent_error_names_op_at_next_sync_and_lease_stays_usable(remote):
    a = cp.arange(3)
    idx = cp.asarray(np.array([0, 7]))
    c = a[idx]  # the index values are on the worker: nothing raised yet (as CuPy's kernel would not)
    d = a + 1
    with pytest.raises(IndexError, match=rf"op #\d+ getitem\(h{a.handle}, h{idx.handle}\): index 7 is out of bounds"):
        c.get()
    np.testing.assert_array_equal(d.get(), [1, 2, 3])  # state unchanged, usable
    with pytest.raises(RuntimeError, match=rf"h{c.handle} is not available: op #\d+ getitem"):
        (c + 1).get()
    assert a.get().tolist() == [0, 1, 2]


def test_index_error_raised_at_the_call(remote):
    a = cp.arange(3)
    with pytest.raises(IndexError, match=r"index 7 is out of bounds for axis 0 with size 3"):
        a[7]
    assert a.get().tolist() == [0, 1, 2]


def test_unknown_op_is_a_clean_error(remote):
    conn = cp.get_connection()
    h = conn.mint()
    conn.enqueue("system", [h], ["rm -rf /"])
    with pytest.raises(cp.UnknownOpError, match=r"op #\d+ system\('rm -rf /'\): unknown op 'system'"):
        cp.cuda.Device().synchronize()
    assert float(cp.ones(2).sum()) == 2.0


def test_unexpected_kwarg_refused(remote):
    conn = cp.get_connection()
    a = cp.ones(3)
    h = conn.mint()
    conn.enqueue("sum", [h], [a._ref, None], {"where": True})
    with pytest.raises(TypeError, match=r"op #\d+ sum\(h\d+, None\): unexpected keyword argument\(s\) where"):
        cp.synchronize()


def test_rawkernel_needs_gpu(remote):
    k = cp.RawKernel('extern "C" __global__ void f(float* x) { x[threadIdx.x] = 1; }', "f")
    with pytest.raises(NotImplementedError, match=r"^RawKernel needs a GPU node \(this lease runs on the NumPy executor\)$"):
        k((1,), (3,), (cp.zeros(3, dtype=cp.float32),))
    # the worker refuses it too, should a client send it anyway
    conn = cp.get_connection()
    conn.enqueue("rawkernel", [], ["code", "f", [1], [1], [], [], 0])
    with pytest.raises(NotImplementedError, match=r"op #\d+ rawkernel\(.*\): RawKernel needs a GPU node"):
        cp.synchronize()


def test_get_array_module(remote):
    assert cp.get_array_module(cp.ones(1)) is cp
    assert cp.get_array_module(np.ones(1)) is np


def test_pipelined_ops_need_one_synchronization(remote):
    conn = cp.get_connection()
    x = cp.zeros(1024, dtype=cp.float32)
    cp.synchronize()
    sent, syncs = conn.ops_sent, conn.syncs
    for _ in range(2000):
        x += 1
    assert conn.syncs == syncs  # queued ops went out without waiting for any answer
    assert 1900 <= conn.ops_sent - sent <= 2000  # in growing batches (1, 2, 4, ... 64 ops)
    assert float(x[0]) == 2000.0
    assert conn.syncs == syncs + 1  # one round trip for the whole loop and the scalar


# -- quota ------------------------------------------------------------------------------------

@pytest.fixture()
def small_lease():
    with attached(quota_bytes=1 << 20) as (handle, conn):
        yield conn, handle


def test_quota_exceeded_raises_oom_and_lease_stays_usable(small_lease):
    conn, _ = small_lease
    free0, total = cp.cuda.runtime.memGetInfo()
    assert total == 1 << 20 and free0 == 1 << 20
    a = cp.zeros(100_000)  # 800,000 bytes
    assert cp.cuda.runtime.memGetInfo() == ((1 << 20) - 800_000, 1 << 20)
    with pytest.raises(cp.cuda.memory.OutOfMemoryError,
                       match=r"^ones\(100000,\): slice memory quota exceeded: "
                             r"needs 800000 bytes, 800000 of 1048576 bytes in use$"):
        cp.ones(100_000)  # raised at the allocating call, as CuPy does
    assert issubclass(cp.cuda.memory.OutOfMemoryError, MemoryError)
    assert cp.cuda.runtime.memGetInfo() == ((1 << 20) - 800_000, 1 << 20)  # unchanged
    assert float(a.sum()) == 0.0  # still usable
    del a
    gc.collect()
    c = cp.ones(100_000)  # the free of `a` travels before this op
    assert float(c.sum()) == 100_000.0


def test_upload_over_quota_raises_at_the_call(small_lease):
    with pytest.raises(cp.OutOfMemoryError, match=r"^upload of float64 \(200000,\): slice memory quota exceeded: "
                                                   r"needs 1600000 bytes, more than the quota of 1048576 bytes$"):
        cp.asarray(np.ones(200_000))
    assert cp.cuda.runtime.memGetInfo() == (1 << 20, 1 << 20)


def test_upload_over_quota_is_drained_and_connection_survives(small_lease):
    conn, _ = small_lease
    conn.quota_bytes = 0  # no client-side check: the worker's (the authority) is tested here
    big = np.ones(200_000)  # 1.6 MB > 1 MiB quota
    x = cp.asarray(big)
    with pytest.raises(cp.OutOfMemoryError, match=r"^op #\d+ upload\(0\): slice memory quota exceeded: needs 1600000 bytes, 0 of 1048576"):
        x.get()
    y = cp.asarray(np.arange(5.0))
    assert y.get().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_views_do_not_count_twice_and_gc_frees(small_lease):
    a = cp.zeros(100_000)  # 800 kB
    views = [a[10:], a.reshape(1000, 100), a.T]
    assert float(views[1].sum()) == 0.0  # views fit: same root buffer
    assert cp.cuda.runtime.memGetInfo()[0] == (1 << 20) - 800_000
    del a, views
    gc.collect()
    for i in range(5):  # 5 x 800 kB would not fit without the frees
        t = cp.full((100_000,), float(i))
        assert float(t[0]) == float(i)
        del t
    assert cp.stats()["memory_in_use_bytes"] <= 800_000


def test_worker_stats_and_stats_file(small_lease):
    conn, handle = small_lease
    x = cp.ones(1000)
    for _ in range(10):
        x += 1
    assert float(x[0]) == 11.0
    s = cp.stats()
    assert s["memory_in_use_bytes"] == 8000
    assert s["quota_bytes"] == 1 << 20
    assert s["ops_total"] >= 13 and s["bytes_in"] > 0 and s["bytes_out"] > 0
    assert s["lease_id"] == conn.lease_id and s["executor"] == "numpy"
