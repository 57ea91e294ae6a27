"""The new ops of issue 14 on the worker's side of the trust line: a client that skips
gpuctl.remote's own checks (raw ops on the connection) cannot make the worker allocate past the
slice's quota or the protocol's element bound; each refusal names the op, holds no memory, and the
connection goes on."""

from __future__ import annotations

import numpy as np
import pytest

import gpuctl.remote as cp
from gpuctl.datapath.testing import running_worker


@pytest.fixture(scope="module")
def conn():
    with running_worker(quota_bytes=8 << 20) as (_, url):
        c = cp.attach(url)
        try:
            yield c
        finally:
            cp.detach()


def raw(conn, name, args, kwargs=None, outs=1):
    hs = [conn.mint() for _ in range(outs)]
    conn.enqueue(name, hs, args, kwargs)
    return hs


BOMBS = {
    "pad": lambda x, v: ("pad", [x, 1 << 20, "constant"], None, r"(pad: \d+ elements \(limit|quota exceeded)"),
    "tile": lambda x, v: ("tile", [x, [1 << 20, 1 << 20]], None, r"(tile: \d+ elements|quota exceeded)"),
    "repeat_int": lambda x, v: ("repeat", [x, 1 << 40], None, r"(repeat: \d+ elements|quota exceeded)"),
    "repeat_array": lambda x, v: ("repeat", [x, v], {"axis": 0}, r"repeat: \d+ elements"),
    "fft_n": lambda x, v: ("fft_fft", [x], {"n": 1 << 40}, r"fft: \d+ elements"),
    "fftn_s": lambda x, v: ("fft_fftn", [x], {"s": [1 << 20, 1 << 20]}, r"fft: \d+ elements"),
    "diag": lambda x, v: ("diag", [x, 1 << 30], None, r"(diag: \d+ elements|quota exceeded)"),
    "meshgrid": lambda x, v: ("meshgrid", [x, x, x, x, x], None, r"(meshgrid|quota exceeded)"),
    "bincount": lambda x, v: ("bincount", [v], {"minlength": 1 << 40}, r"bincount: \d+ elements"),
    "gen_random": lambda x, v: ("gen_random", [1, [1 << 20, 1 << 20]], None, r"(elements \(limit|quota exceeded)"),
    "gen_random_quota": lambda x, v: ("gen_random", [1, [1 << 12, 1 << 12]], None, r"quota exceeded"),
    "fftfreq": lambda x, v: ("fft_fftfreq", [1 << 40], None, r"(quota exceeded|n must be)"),
    "pad_mode": lambda x, v: ("pad", [x, 1, "linear_ramp"], None, r"pad: mode 'linear_ramp' is not supported"),
    "percentile_method": lambda x, v: ("percentile", [x, 50.0], {"method": "weibull"}, r"method 'weibull'"),
    "elementwise_kernel_numpy": lambda x, v: ("elementwise_kernel", ["float32 x", "float32 y", "y = x", "k", "", [x]],
                                              None, r"ElementwiseKernel needs a GPU node"),
}


@pytest.mark.parametrize("case", sorted(BOMBS))
def test_refused_before_allocating_and_connection_goes_on(conn, case):
    x = cp.asarray(np.arange(1000, dtype=np.float64))  # 8 kB
    v = cp.asarray(np.array([1 << 40], dtype=np.int64))
    conn.enqueue("gen_new", [], [1, 5])
    cp.synchronize()
    used = cp.stats()["memory_in_use_bytes"]
    name, args, kwargs, pattern = BOMBS[case](x._ref, v._ref)
    outs = 5 if name == "meshgrid" else 1
    raw(conn, name, args, kwargs, outs=0 if name == "elementwise_kernel" else outs)
    with pytest.raises((MemoryError, ValueError, NotImplementedError), match=rf"op #\d+ {name}\(.*\): .*{pattern}"):
        cp.synchronize()
    assert cp.stats()["memory_in_use_bytes"] == used
    assert float(x.sum()) == 499500.0


def test_generator_ids_are_bounded_and_checked(conn):
    for gid in range(300):
        conn.enqueue("gen_new", [], [1000 + gid, gid])
    with pytest.raises(ValueError, match=r"too many random generators on this connection \(limit 256\)"):
        cp.synchronize()
    raw(conn, "gen_random", [99999, [2]])
    with pytest.raises(ValueError, match=r"random generator g99999 does not exist"):
        cp.synchronize()
    conn.enqueue("gen_new", [], [5, -1])
    with pytest.raises(ValueError, match=r"random seed must be an integer in \[0, 2\*\*64\)"):
        cp.synchronize()
