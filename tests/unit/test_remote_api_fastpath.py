"""The worker's hot path (gpuctl.datapath.fastpath) against its general path: for the same ops
(hypothesis over ufuncs, matmul, shapes, dtypes, scalars, in-place ``out``, frees, and the error
cases: unknown and poisoned handles, shapes that do not broadcast, the quota), the handle table,
the results, the lease's accounting and the first error's message are the same."""

from __future__ import annotations

import socket

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gpuctl.datapath import fastpath
from gpuctl.datapath.accounting import LeaseAccounting
from gpuctl.datapath.executor_numpy import NumpyExecutor
from gpuctl.datapath.protocol import DEFAULT_LIMITS
from gpuctl.datapath.session import Session

DTYPES = st.sampled_from(["float32", "float64", "int32", "int64", "bool", "float16"])
NAMES = st.sampled_from(["add", "multiply", "subtract", "maximum", "true_divide", "negative", "exp", "matmul",
                         "dot", "equal", "bitwise_and", "sqrt", "logaddexp"])


def session(quota: int = 1 << 20) -> tuple[Session, socket.socket]:
    a, b = socket.socketpair()
    ex = NumpyExecutor(quota)
    acct = LeaseAccounting(quota, ex.root)
    return Session(a, ex, acct, DEFAULT_LIMITS, {}), b


def run_ops(ops: list, arrays: dict, fast: bool, quota: int = 1 << 20) -> tuple:
    s, peer = session(quota)
    try:
        for h, arr in arrays.items():
            s.handles[h] = arr.copy()
            s.acct.acquire(s.handles[h], "setup")
        saved = dict(fastpath.FAST_OPS)
        if not fast:
            fastpath.FAST_OPS.clear()
        try:
            queries: list = []
            for op in ops:
                s.seq += 1
                s._run_op(op, None, queries)
        finally:
            fastpath.FAST_OPS.update(saved)
        table = {h: (repr(v.tolist()), str(v.dtype)) if hasattr(v, "dtype") else ("poisoned", v.message)
                 for h, v in sorted(s.handles.items())}
        return table, s.error, s.acct.memory_in_use_bytes
    finally:
        s.close()
        peer.close()


shapes = st.sampled_from([(), (3,), (1, 3), (2, 3), (3, 2), (2, 1), (4,)])


@settings(max_examples=150, deadline=None)
@given(name=NAMES, d1=DTYPES, d2=DTYPES, s1=shapes, s2=shapes, scalar=st.one_of(st.none(), st.integers(-3, 3),
                                                                                st.floats(-2, 2), st.booleans()),
       inplace=st.booleans(), data=st.data())
def test_hot_path_equals_general_path(name, d1, d2, s1, s2, scalar, inplace, data):
    a = data.draw(hnp.arrays(d1, s1, elements=st.integers(0, 3).map(lambda v: v if d1 != "bool" else bool(v))))
    b = data.draw(hnp.arrays(d2, s2, elements=st.integers(0, 3).map(lambda v: v if d2 != "bool" else bool(v))))
    arrays = {1: a, 2: b}
    unary = name in ("negative", "exp", "sqrt")
    second = scalar if scalar is not None and name not in ("matmul", "dot") else {"h": 2}
    args = [{"h": 1}] if unary else [{"h": 1}, second]
    ops = []
    if inplace:
        ops.append([name, [], args, {"out": {"h": 1}}])
    else:
        ops.append([name, [10], args])
        ops.append(["add", [11], [{"h": 10}, 1]])  # uses the result (or its poisoned handle)
    ops.append(["free", [], [{"h": 2}]])
    with np.errstate(all="ignore"):
        assert run_ops(ops, arrays, fast=True) == run_ops(ops, arrays, fast=False)


@pytest.mark.parametrize("ops", [
    [["add", [10], [{"h": 99}, 1]]],  # unknown handle
    [["matmul", [10], [{"h": 1}, {"h": 1}]], ["add", [11], [{"h": 10}, 1]]],  # shape error, then poisoned use
    [["add", [10], [{"h": 1}, {"h": 3}]]],  # does not broadcast
    [["add", [1], [{"h": 1}, 1]]],  # output handle already in use
    [["add", [10, 11], [{"h": 1}, 1]]],  # two outputs for one result
    [["add", [10], [{"h": 1}, "x"]]],  # a string operand
    [["add", [], [{"h": 1}, 1], {"out": {"h": 99}}]],  # unknown out
    [["add", [], [{"h": 1}, 1], {"where": True}]],  # keyword not allowed
    [["free", [], [{"h": 1}, 5]]],  # free of a non-handle
    [["outer", [10], [{"h": 3}, {"h": 3}]]] * 1,  # not a hot-path op
])
def test_errors_are_the_same_on_both_paths(ops):
    arrays = {1: np.ones((2, 3), np.float32), 3: np.ones(4, np.float64)}
    assert run_ops(ops, arrays, fast=True) == run_ops(ops, arrays, fast=False)


def test_quota_refusal_is_the_same_on_both_paths():
    arrays = {1: np.ones((200, 200), np.float64)}  # 320 kB of a 512 kB quota
    ops = [["add", [10], [{"h": 1}, 1]], ["add", [11], [{"h": 1}, 2]]]
    fast = run_ops(ops, arrays, fast=True, quota=512 << 10)
    assert fast == run_ops(ops, arrays, fast=False, quota=512 << 10)
    assert fast[1]["type"] == "OutOfMemoryError" and "slice memory quota exceeded" in fast[1]["message"]
    assert fast[2] == 320_000  # the refused op counted nothing


def test_signature_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(fastpath, "MAX_SIGNATURES", 8)
    s, peer = session(1 << 24)
    try:
        for n in range(1, 30):
            s.handles[n] = np.ones(n, np.float32)
            s.seq += 1
            s._run_op(["add", [1000 + n], [{"h": n}, 1]], None, [])
            assert len(s._sig_cache.estimates) <= 8
        assert s.error is None
        np.testing.assert_array_equal(s.handles[1029], np.full(29, 2, np.float32))
    finally:
        s.close()
        peer.close()


# -- the client's hot path for operators (gpuctl.remote._ndarray._fast_binary) -----------------

@pytest.fixture(scope="module")
def remote():
    import gpuctl.remote as cp
    from gpuctl.datapath.testing import running_worker

    with running_worker(quota_bytes=64 << 20) as (_, url):
        cp.attach(url)
        try:
            yield cp
        finally:
            cp.detach()


OPERATORS = ["__add__", "__sub__", "__mul__", "__truediv__", "__floordiv__", "__pow__", "__radd__", "__rsub__",
             "__rmul__", "__rtruediv__", "__lt__", "__eq__", "__and__", "__rand__", "__mod__"]


@settings(max_examples=120, deadline=None)
@given(dt=DTYPES, dt2=DTYPES, op=st.sampled_from(OPERATORS), scalar=st.one_of(st.integers(-3, 3), st.floats(-2, 2),
                                                                              st.booleans(), st.none()))
def test_operator_hot_path_equals_numpy(remote, dt, dt2, op, scalar):
    cp = remote
    a = (np.arange(6).reshape(2, 3) % 3 + 1).astype(dt)
    b = (np.arange(6).reshape(2, 3) % 2 + 1).astype(dt2)
    other_np = scalar if scalar is not None else b
    other = scalar if scalar is not None else cp.asarray(b)
    with np.errstate(all="ignore"):
        try:
            if op == "__pow__":
                # NumPy's operator special-cases some scalar exponents (``a ** 2`` is np.square:
                # bool ** 2 is int8 there, np.power gives int64); CuPy's operator is the ufunc.
                want = np.power(a, other_np)
            else:
                want = getattr(a, op)(other_np)
        except Exception as e:  # noqa: BLE001 - the remote call must raise the same kind at the call
            with pytest.raises(type(e) if not isinstance(e, TypeError) else TypeError):
                r = getattr(cp.asarray(a), op)(other)
                r.get()
            return
    if want is NotImplemented:
        return
    got = getattr(cp.asarray(a), op)(other)
    assert got._shape == want.shape and got._dtype == want.dtype, (got._shape, got._dtype, want.shape, want.dtype)
    host = got.get()
    assert host.dtype == want.dtype
    np.testing.assert_array_equal(host, want)


def test_other_executors_take_the_general_path():
    s, peer = session(1 << 20)
    try:
        s.executor.name = "torch"  # an executor with its own op table: never the hot path
        s.handles[1] = np.ones(3, np.float32)
        s.seq += 1
        s._run_op(["add", [2], [{"h": 1}, 1]], None, [])
        s.seq += 1
        s._run_op(["free", [], [{"h": 2}]], None, [])
        assert "_sig_cache" not in s.__dict__ and 2 not in s.handles and s.error is None
    finally:
        s.close()
        peer.close()
