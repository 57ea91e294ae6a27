"""Errors raised where CuPy raises them (issue 14 item 2): shape, axis, dtype and broadcasting
errors at the call (from the client's inference, nothing queued), OutOfMemoryError at the
allocating call (the client's count of live bytes, confirmed by the worker), and errors only the
worker can see still at the next synchronization, naming the op. Each error leaves the lease as
it was. Messages are checked against NumPy's own where NumPy raises the same error."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import gpuctl.remote as cp
from remote_lease import attached


@pytest.fixture(scope="module")
def remote():
    with attached(quota_bytes=64 << 20) as (_, conn):
        yield conn


def queued(conn) -> int:
    """Ops sent or queued so far on `conn` (unchanged when a call raised before queueing)."""
    return conn.ops_sent + len(conn._ops)


def numpy_error(fn, *args):
    with pytest.raises(Exception) as ei:
        fn(*args)
    return ei.type, str(ei.value)


CASES = {
    # name: (remote call, numpy call, exception type, message regex)
    "expand_dims_bad_axis": (lambda xp, a: xp.expand_dims(a, 5), np.exceptions.AxisError, r"axis 5 is out of bounds"),
    "matmul_0d": (lambda xp, a, s: xp.matmul(s, a), ValueError, r"matmul: Input operand 0 does not have enough"),
    "matmul_mismatch": (lambda xp, a: a @ a, ValueError, r"matmul: Input operand 1 has a mismatch"),
    "dot_mismatch": (lambda xp, a: xp.dot(a, a), ValueError, r"shapes \(3, 4\) and \(3, 4\) not aligned"),
    "bool_mask_wrong_shape": (lambda xp, a, m: a[m], IndexError,
                              (r"boolean index did not match indexed array along axis 0; size of axis is 3 but "
                               r"size of corresponding boolean axis is 4")),
    "broadcast": (lambda xp, a, o5: a + o5, ValueError, r"operands could not be broadcast together"),
    "broadcast_inplace_where": (lambda xp, a, o7: xp.where(a, a, o7), ValueError,
                                r"operands could not be broadcast together"),
    "sum_bad_axis": (lambda xp, a: a.sum(axis=2), np.exceptions.AxisError, r"axis 2 is out of bounds"),
    "mean_dup_axis": (lambda xp, a: a.mean(axis=(0, 0)), ValueError, r"duplicate value in 'axis'"),
    "argmax_bad_axis": (lambda xp, a: xp.argmax(a, axis=-3), np.exceptions.AxisError, r"axis -3 is out of bounds"),
    "index_out_of_bounds": (lambda xp, a: a[3], IndexError, r"index 3 is out of bounds for axis 0 with size 3"),
    "too_many_indices": (lambda xp, a: a[0, 0, 0], IndexError, r"too many indices"),
    "reshape_size": (lambda xp, a: a.reshape(5, 2), ValueError, r"cannot reshape array of size 12 into shape \(5, 2\)"),
    "transpose_axes": (lambda xp, a: a.transpose(0, 0), ValueError, r"axes don't match array"),
    "squeeze_not_one": (lambda xp, a: a.squeeze(0), ValueError, r"cannot select an axis to squeeze out"),
    "concatenate_mismatch": (lambda xp, a, o35: xp.concatenate([a, o35], axis=0), ValueError,
                             r"all the input array dimensions except for the concatenation axis must match"),
    "stack_mismatch": (lambda xp, a, o43: xp.stack([a, o43]), ValueError,
                       r"all input arrays must have the same shape"),
    "ufunc_no_loop": (lambda xp, a: xp.bitwise_and(a, a), TypeError, r"ufunc 'bitwise_and' not supported"),
    "swapaxes_bad": (lambda xp, a: a.swapaxes(0, 4), np.exceptions.AxisError, r"axis 4 is out of bounds"),
    "moveaxis_bad": (lambda xp, a: xp.moveaxis(a, 0, 9), np.exceptions.AxisError, r"out of bounds"),
    "broadcast_to_bad": (lambda xp, a: xp.broadcast_to(a, (2, 3)), ValueError, r"broadcast"),
    "take_bad_axis": (lambda xp, a: xp.take(a, [0], axis=3), np.exceptions.AxisError, r"axis 3 is out of bounds"),
    "diff_bad_axis": (lambda xp, a: xp.diff(a, axis=2), np.exceptions.AxisError, r"axis 2 is out of bounds"),
    "cumsum_bad_axis": (lambda xp, a: a.cumsum(axis=5), np.exceptions.AxisError, r"axis 5 is out of bounds"),
}


#: The second operand of the cases that take one (made before the call under test).
OPERANDS = {
    "matmul_0d": np.float32(3.0) * np.ones((), np.float32),
    "bool_mask_wrong_shape": np.ones(4, bool),
    "broadcast": np.ones(5, np.float32),
    "broadcast_inplace_where": np.ones(7, np.float32),
    "concatenate_mismatch": np.ones((3, 5), np.float32),
    "stack_mismatch": np.ones((4, 3), np.float32),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_error_raises_at_the_call_as_numpy_does(remote, case):
    fn, etype, pattern = CASES[case]
    a_np = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = cp.asarray(a_np)
    extra_np = OPERANDS.get(case)
    extra = [cp.asarray(extra_np)] if extra_np is not None else []
    cp.synchronize()
    free_before = cp.cuda.runtime.memGetInfo()
    before = queued(remote)
    with pytest.raises(etype, match=pattern):
        fn(cp, a, *extra)
    assert queued(remote) == before, "nothing may be queued by a call that raised"
    # NumPy raises the same kind of error for the same call
    with pytest.raises(etype):
        fn(np, a_np, *([extra_np] if extra_np is not None else []))
    assert cp.cuda.runtime.memGetInfo() == free_before
    np.testing.assert_array_equal(a.get(), a_np)  # the lease goes on


def test_inplace_same_kind_casting_error_at_the_call(remote):
    x = cp.arange(3)
    with pytest.raises(TypeError, match=r"Cannot cast ufunc 'add' output from dtype\('float64'\) to dtype\('int64'\)"):
        x += 1.5
    x += 1
    assert x.get().tolist() == [1, 2, 3]


def test_inplace_casting_check_is_by_operand_dtype_not_type(remote):
    x = cp.arange(3, dtype=cp.int32)
    with pytest.raises(TypeError, match=r"Cannot cast ufunc 'add' output from dtype\('float64'\)"):
        x += np.ones(3, np.float64)  # a NumPy float array: refused at the call
    x += np.ones(3, np.int32)  # a NumPy int array of the same Python type: allowed
    x += [1, 1, 1]  # a list: the worker checks
    assert x.get().tolist() == [2, 3, 4]


def test_value_dependent_errors_still_surface_at_next_sync_naming_the_op(remote):
    a = cp.arange(3)
    idx = cp.asarray(np.array([5], np.int64))
    bad = cp.take(a, idx)  # shape is known, the value is not: no error at the call
    with pytest.raises(IndexError, match=r"op #\d+ take\(h\d+, h\d+\): index 5 is out of bounds"):
        bad.get()
    assert a.get().tolist() == [0, 1, 2]


# -- OutOfMemoryError at the allocating call ----------------------------------------------------

@pytest.fixture()
def slice_20mib():
    with attached(quota_bytes=20 << 20) as (_, conn):
        yield conn


def test_allocation_over_the_quota_raises_at_the_call(slice_20mib):
    conn = slice_20mib
    before = queued(conn)
    with pytest.raises(cp.cuda.memory.OutOfMemoryError,
                       match=r"^zeros\(8053063680,\): slice memory quota exceeded: needs 32212254720 bytes, more "
                             r"than the quota of 20971520 bytes$"):
        cp.zeros(30 << 28, dtype=cp.float32)  # 30 GiB in a 20 MiB slice
    assert queued(conn) == before
    assert cp.cuda.runtime.memGetInfo() == (20 << 20, 20 << 20)


def test_allocation_over_the_element_bound_is_out_of_memory_not_value_error(slice_20mib):
    with pytest.raises(cp.OutOfMemoryError, match=r"slice memory quota exceeded"):
        cp.empty((1 << 20, 1 << 20), dtype=cp.bool_)  # 2^40 elements: over the protocol's 2^36 too
    with pytest.raises(cp.OutOfMemoryError):
        cp.random.rand(1 << 37)
    with pytest.raises(cp.OutOfMemoryError):
        cp.ones((4096, 4096)) @ cp.ones((4096, 4096))  # each operand alone is 128 MiB


def test_live_arrays_count_and_frees_give_room_back(slice_20mib):
    conn = slice_20mib
    a = cp.zeros(2 << 20)  # 16 MiB of 20
    with pytest.raises(cp.OutOfMemoryError, match=r"^ones\(1048576,\): slice memory quota exceeded: needs 8388608 "
                                                  r"bytes, 16777216 of 20971520 bytes in use$"):
        cp.ones(1 << 20)  # 8 MiB more
    assert cp.cuda.runtime.memGetInfo() == ((20 << 20) - (16 << 20), 20 << 20)
    del a
    gc.collect()
    b = cp.ones(1 << 20)  # the free of `a` counts before this allocation
    assert float(b[0]) == 1.0
    assert conn.live_bytes == 8 << 20


def test_client_count_is_checked_by_the_worker_before_raising(slice_20mib):
    """The client counts a result the worker never held (its op failed): the next allocation that
    seems not to fit asks the worker, which first raises the queued error (next sync, naming the
    op), then lets the allocation through once the count is corrected."""
    conn = slice_20mib
    a = cp.arange(3)
    idx = cp.asarray(np.full(2 << 20, 7, np.int8))  # 2 MiB of indices, all out of bounds
    bad = cp.take(a, idx)  # 16 MiB result counted by the client; fails on the worker
    assert conn.live_bytes >= 18 << 20
    with pytest.raises(IndexError, match=r"op #\d+ take\(h\d+, h\d+\): index 7 is out of bounds"):
        cp.zeros(1 << 19)  # 4 MiB: the client asks the worker; the queued error comes first
    c = cp.zeros(1 << 19)  # now the worker's figure (2 MiB in use) says it fits
    assert float(c.sum()) == 0.0
    assert cp.cuda.runtime.memGetInfo()[0] == (20 << 20) - (2 << 20) - 24 - (4 << 20)
    del bad


def test_other_connections_of_the_lease_are_the_workers_to_count(slice_20mib):
    """Memory held by another connection of the lease is not in this client's count: when this
    client's count says the allocation fits, the worker's check (the authority) refuses it at the
    next synchronization, naming the op."""
    from gpuctl.remote._connection import Connection

    other = Connection(slice_20mib.spec)
    try:
        h = other.mint()
        other.enqueue("zeros", [h], [[2 << 20], {"d": "float64"}])  # 16 MiB held by another connection
        other.sync("sync")
        x = cp.zeros(5 << 17)  # 5 MiB: fits by this client's count (0), not by the worker's (16 MiB in use)
        with pytest.raises(cp.OutOfMemoryError, match=r"^op #\d+ zeros\(\(655360,\), float64\): slice memory "
                                                      r"quota exceeded: needs 5242880 bytes, 16777216 of 20971520"):
            x.get()
        assert cp.cuda.runtime.memGetInfo() == ((20 << 20) - (16 << 20), 20 << 20)  # unchanged
    finally:
        other.close()

