"""Security review of the data path (docs/DATAPATH.md, DESIGN.md "Promises"): an authenticated
client must not get outside the allow-list (object/string/void dtypes), nor make the worker
allocate far more than its slice's quota before the quota check (broadcast views, joins of one
handle many times, outer-product style ops, advanced indexing); an unauthenticated peer must not
pin the worker's connection slots (slowloris).

Op tests drive a Session in-process over a socketpair (fast, no worker process); allocation is
measured with tracemalloc, which NumPy reports its array buffers to.
"""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys
import time
import tracemalloc

import pytest

from gpuctl.datapath.accounting import LeaseAccounting
from gpuctl.datapath.executor_numpy import NumpyExecutor
from gpuctl.datapath.protocol import (
    DEFAULT_LIMITS,
    FrameReader,
    FrameType,
    encode_meta,
    hello_meta,
    pack_header,
)
from gpuctl.datapath.session import Poisoned, Session
from gpuctl.datapath.testing import running_worker

QUOTA = 1 << 20  # 1 MiB


@pytest.fixture
def session():
    a, b = socket.socketpair()
    ex = NumpyExecutor(QUOTA)
    s = Session(a, ex, LeaseAccounting(QUOTA, ex.root), DEFAULT_LIMITS, {})
    try:
        yield s
    finally:
        s.close()
        a.close()
        b.close()


def run(s: Session, *ops) -> dict | None:
    """Run `ops` (wire form) as one batch would; return the first error and clear it."""
    queries: list = []
    for op in ops:
        s.seq += 1
        s._run_op(op, None, queries)
    err, s.error = s.error, None
    return err


def peak_alloc(fn) -> tuple[object, int]:
    """(fn(), peak bytes traced while it ran)."""
    tracemalloc.start()
    try:
        out = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return out, peak


# ---------------------------------------------------------------------------------------------
# dtypes outside the wire list


@pytest.mark.parametrize("op", [
    ["zeros", [1], [[4], "object"]],
    ["zeros", [1], [[4]], {"dtype": "O"}],
    ["empty", [1], [[2], "(1000,1000)f8"]],
    ["ones", [1], [[3], "M8[ns]"]],
    ["arange", [1], [0, 3, 1, "U8"]],
])
def test_creation_with_a_non_wire_dtype_is_refused(session, op):
    err = run(session, op)
    assert err is not None and err["type"] == "TypeError", err
    assert "is not allowed" in err["message"]
    assert isinstance(session.handles[1], Poisoned)
    assert session.acct.memory_in_use_bytes == 0


@pytest.mark.parametrize("op", [
    ["add", [2], [{"h": 1}, {"h": 1}], {"dtype": "O"}],
    ["astype", [2], [{"h": 1}, "U10"]],
    ["astype", [2], [{"h": 1}, "object"]],
    ["sum", [2], [{"h": 1}], {"dtype": "V8"}],
    ["zeros_like", [2], [{"h": 1}], {"dtype": "object"}],
])
def test_ops_on_arrays_refuse_a_non_wire_dtype(session, op):
    assert run(session, ["ones", [1], [[4]]]) is None
    err = run(session, op)
    assert err is not None and err["type"] == "TypeError", err
    assert "is not allowed" in err["message"]
    assert isinstance(session.handles[2], Poisoned)
    assert session.acct.memory_in_use_bytes == 32  # only h1 (4 float64)


def test_string_arguments_cannot_become_string_arrays(session):
    # np.multiply("x" * n, k) is an n*k-character string: 4 bytes a character, outside any estimate
    err, peak = peak_alloc(lambda: run(session, ["multiply", [1], ["x" * 4096, 4096]]))
    assert err is not None and err["type"] == "TypeError", err
    assert "a string is not allowed here" in err["message"]
    assert peak < (8 << 20)
    assert run(session, ["full", [2], [[1024], "y" * 1024]])["message"].endswith("a string is not allowed here")
    assert run(session, ["concatenate", [3], [["a", "b"]]])["message"].endswith("a string is not allowed here")
    assert session.acct.memory_in_use_bytes == 0


def test_allowed_strings_still_work(session):
    assert run(session, ["zeros", [1], [[2, 3], {"d": "float32"}]]) is None
    assert run(session, ["reshape", [2], [{"h": 1}, [3, 2], "F"]]) is None
    assert run(session, ["einsum", [3], ["ij->ji", {"h": 1}]]) is None
    assert run(session, ["add", [4], [{"h": 1}, 1], {"casting": "same_kind", "dtype": {"d": "float64"}}]) is None
    assert session.handles[3].shape == (3, 2) and str(session.handles[4].dtype) == "float64"


# ---------------------------------------------------------------------------------------------
# allocations far over the quota before the quota check


def _assert_refused_before_allocating(session, op, setup=()):
    for s_op in setup:
        assert run(session, s_op) is None, s_op
    before = session.acct.memory_in_use_bytes
    err, peak = peak_alloc(lambda: run(session, op))
    assert err is not None and err["type"] == "OutOfMemoryError", err
    assert "slice memory quota exceeded" in err["message"]
    assert peak < 4 * QUOTA, f"{op[0]} allocated {peak} bytes before being refused"
    assert session.acct.memory_in_use_bytes == before
    assert isinstance(session.handles[op[1][0]], Poisoned)


def test_broadcast_view_larger_than_the_quota_is_refused(session):
    _assert_refused_before_allocating(session, ["broadcast_to", [2], [{"h": 1}, [1 << 16, 1 << 10]]],
                                      setup=[["ones", [1], [[1 << 10]]]])


def test_concatenate_of_one_handle_many_times_is_refused_before_allocating(session):
    # 4096 x 64 KiB = 256 MiB from one 64 KiB array
    _assert_refused_before_allocating(session, ["concatenate", [2], [[{"h": 1}] * 4096]],
                                      setup=[["ones", [1], [[1 << 13]]]])


def test_stack_of_one_handle_many_times_is_refused_before_allocating(session):
    _assert_refused_before_allocating(session, ["stack", [2], [[{"h": 1}] * 4096]],
                                      setup=[["ones", [1], [[1 << 13]]]])


def test_tensordot_outer_product_is_refused_before_allocating(session):
    # axes=0 of two 8192-element vectors: 8192^2 x 8 bytes = 512 MiB
    _assert_refused_before_allocating(session, ["tensordot", [2], [{"h": 1}, {"h": 1}], {"axes": 0}],
                                      setup=[["ones", [1], [[1 << 13]]]])


def test_einsum_outer_product_is_refused_before_allocating(session):
    _assert_refused_before_allocating(session, ["einsum", [2], ["i,j->ij", {"h": 1}, {"h": 1}]],
                                      setup=[["ones", [1], [[1 << 13]]]])


def test_inner_of_matrices_is_refused_before_allocating(session):
    # (8192, 1) . (8192, 1) -> (8192, 8192)
    _assert_refused_before_allocating(session, ["inner", [2], [{"h": 1}, {"h": 1}]],
                                      setup=[["ones", [1], [[1 << 13, 1]]]])


def test_dot_of_stacked_matrices_is_refused_before_allocating(session):
    # (64, 64, 1) . (64, 1, 64) -> (64, 64, 64, 64) = 16.7 M elements = 128 MiB
    _assert_refused_before_allocating(session, ["dot", [3], [{"h": 1}, {"h": 2}]],
                                      setup=[["ones", [1], [[64, 64, 1]]], ["ones", [2], [[64, 1, 64]]]])


def test_advanced_index_repeating_a_row_is_refused_before_allocating(session):
    # a (1, 8192) row indexed by 4096 zeros -> (4096, 8192) = 256 MiB
    _assert_refused_before_allocating(session, ["getitem", [2], [{"h": 1}, [[0] * 4096]]],
                                      setup=[["ones", [1], [[1, 1 << 13]]]])
    _assert_refused_before_allocating(session, ["getitem", [4], [{"h": 1}, {"h": 3}]],
                                      setup=[["zeros", [3], [[1 << 13], {"d": "int64"}]]])


def test_linspace_with_array_endpoints_is_refused(session):
    assert run(session, ["ones", [1], [[1 << 13]]]) is None
    err, peak = peak_alloc(lambda: run(session, ["linspace", [2], [{"h": 1}, 2.0, 4096]]))
    assert err is not None and err["type"] == "TypeError" and "start and stop must be numbers" in err["message"]
    assert peak < 4 * QUOTA


def test_like_ops_count_the_dtype_they_are_asked_for(session):
    # 64 Ki int8 = 64 KiB; as complex128 it is 1 MiB, over what is left of the quota
    _assert_refused_before_allocating(session, ["zeros_like", [2], [{"h": 1}], {"dtype": {"d": "complex128"}}],
                                      setup=[["zeros", [1], [[1 << 16], {"d": "int8"}]]])


def test_views_and_fitting_ops_still_work(session):
    assert run(session, ["ones", [1], [[256, 256]]]) is None  # 512 KiB
    assert run(session, ["transpose", [2], [{"h": 1}]]) is None
    assert run(session, ["getitem", [3], [{"h": 1}, [{"s": [0, 10, None]}, 0]]]) is None
    assert run(session, ["getitem", [4], [{"h": 1}, [[0, 1, 2]]]]) is None
    assert run(session, ["einsum", [6], ["ij->i", {"h": 1}]]) is None
    assert run(session, ["concatenate", [7], [[{"h": 4}, {"h": 4}]]]) is None
    assert session.handles[7].shape == (6, 256)
    assert session.acct.memory_in_use_bytes == 512 * 1024 + 3 * 256 * 8 + 256 * 8 + 6 * 256 * 8  # h4, h6, h7


# ---------------------------------------------------------------------------------------------
# handshake: slowloris


def _worker(tmp_path, *extra: str):
    token = secrets.token_bytes(32)
    lease = "lease-slow"
    argv = [sys.executable, "-m", "gpuctl.datapath.worker", "--lease-id", lease, "--executor", "numpy",
            "--quota-bytes", str(1 << 20), "--expires-at-s", f"{time.time() + 60:.3f}",
            "--run-dir", str(tmp_path), *extra]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    proc.stdin.write(token.hex().encode() + b"\n")
    proc.stdin.flush()
    line = proc.stdout.readline().decode().split()
    assert line and line[0] == "ready", line
    host, port = line[1].rsplit(":", 1)
    return proc, (host, int(port)), token, lease


def _hello(addr, token, lease) -> tuple[socket.socket, FrameType]:
    s = socket.create_connection(addr, timeout=5)
    meta = encode_meta(hello_meta(lease))
    s.sendall(pack_header(FrameType.HELLO, len(meta), len(token)) + meta + token)
    hdr = FrameReader(s).header()
    return s, hdr.ftype


@pytest.fixture
def slow_worker(tmp_path):
    procs = []

    def start(*extra):
        w = _worker(tmp_path, *extra)
        procs.append(w[0])
        return w

    try:
        yield start
    finally:
        for p in procs:
            p.kill()
            p.wait()
            p.stdin.close()
            p.stdout.close()


def test_handshake_deadline_is_for_the_whole_handshake_not_per_read(slow_worker):
    proc, addr, token, lease = slow_worker("--handshake-timeout-s", "1")
    s = socket.create_connection(addr, timeout=5)
    try:
        t0 = time.monotonic()
        closed_at = None
        for b in pack_header(FrameType.HELLO, 10, 32):  # one byte every 0.3 s: each read is quick
            try:
                s.sendall(bytes([b]))
                s.settimeout(0.3)
                if s.recv(1) == b"":
                    closed_at = time.monotonic() - t0
                    break
            except socket.timeout:
                continue
            except OSError:
                closed_at = time.monotonic() - t0
                break
        assert closed_at is not None and closed_at < 3.0, "a dribbling peer kept its handshake open"
    finally:
        s.close()
    ok, ftype = _hello(addr, token, lease)
    ok.close()
    assert ftype is FrameType.WELCOME


def test_connections_that_never_authenticate_do_not_lock_the_client_out(slow_worker):
    proc, addr, token, lease = slow_worker("--max-connections", "2", "--handshake-timeout-s", "30")
    idle = [socket.create_connection(addr, timeout=5) for _ in range(6)]
    try:
        time.sleep(0.3)
        s, ftype = _hello(addr, token, lease)
        s.close()
        assert ftype is FrameType.WELCOME, "idle unauthenticated connections kept the lease's client out"
        a, fa = _hello(addr, token, lease)
        b, fb = _hello(addr, token, lease)
        c, fc = _hello(addr, token, lease)  # third authenticated connection over --max-connections 2
        for x in (a, b, c):
            x.close()
        assert (fa, fb, fc) == (FrameType.WELCOME, FrameType.WELCOME, FrameType.ERROR)
    finally:
        for s in idle:
            s.close()


# ---------------------------------------------------------------------------------------------
# the run dir belongs to the worker's user: the daemon must not follow links planted there


def test_stderr_tail_does_not_follow_a_symlink_in_the_run_dir(tmp_path):
    from types import SimpleNamespace

    from gpuctl.daemon.leases import _stderr_tail
    from gpuctl.datapath.launcher import _tail

    secret = tmp_path / "secret"
    secret.write_text("root-only secret")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "stderr.log").symlink_to(secret)
    assert _stderr_tail(SimpleNamespace(run_dir=str(run_dir))) == ""
    assert _tail(str(run_dir / "stderr.log")) == "(no stderr)"
    (run_dir / "stderr.log").unlink()
    (run_dir / "stderr.log").write_text("worker said this")
    assert _stderr_tail(SimpleNamespace(run_dir=str(run_dir))) == "; its stderr ends: worker said this"
