"""The CuPy executor on a real GPU (skipped where CuPy or a GPU is missing): ops equal local CuPy,
quota through the memory pool, RawKernel, large transfers."""

from __future__ import annotations

import numpy as np
import pytest

from remote_lease import attached, cupy_on_a_gpu

cupy = cupy_on_a_gpu()  # skips this module where CuPy or an NVIDIA GPU is missing
pytestmark = pytest.mark.gpu

import gpuctl.remote as cp  # noqa: E402
from gpuctl.datapath.testing import cuda_device_uuid  # noqa: E402


@pytest.fixture(scope="module")
def gpu_lease():
    with attached(executor="cupy", gpu_uuid=cuda_device_uuid(), quota_bytes=2 << 30) as (handle, _):
        yield handle


def test_ops_match_local(gpu_lease):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal((32, 16)).astype(np.float32)
    ra, rb = cp.asarray(a), cp.asarray(b)
    np.testing.assert_allclose((ra @ rb).get(), a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(cp.tanh(ra).sum(axis=0).get(), np.tanh(a).sum(axis=0), rtol=1e-4, atol=1e-4)
    x = cp.zeros(1024, dtype=cp.float32)
    for _ in range(100):
        x += 1
    assert float(x[5]) == 100.0
    assert cp.get_connection().executor == "cupy"


def test_quota_through_memory_pool(gpu_lease):
    big = cp.empty((1 << 30) // 4, dtype=cp.float32)  # 1 GiB
    with pytest.raises(cp.cuda.memory.OutOfMemoryError, match=r"^empty\(.*slice memory quota exceeded"):
        cp.empty((3 << 29) // 4, dtype=cp.float32)  # 1.5 GiB more: over the 2 GiB quota, at the call
    conn = cp.get_connection()
    quota, conn.quota_bytes = conn.quota_bytes, 0  # no client-side check: the worker's is tested here
    try:
        with pytest.raises(cp.cuda.memory.OutOfMemoryError, match="op #"):
            cp.empty((3 << 29) // 4, dtype=cp.float32).get()
    finally:
        conn.quota_bytes = quota
    del big
    assert float(cp.ones(10).sum()) == 10.0


def test_rawkernel(gpu_lease):
    k = cp.RawKernel(r'''extern "C" __global__ void scale(float* x, float s, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= s; }''', "scale")
    x = cp.ones(1000, dtype=cp.float32)
    k((4,), (256,), (x, np.float32(3.0), np.int32(1000)))
    np.testing.assert_array_equal(x.get(), np.full(1000, 3.0, np.float32))


def test_large_transfer_round_trip(gpu_lease):
    host = np.arange(64 << 20, dtype=np.float32)  # 256 MiB, many staging chunks
    r = cp.asarray(host)
    back = r.get()
    np.testing.assert_array_equal(back, host)
    assert float(r[-1]) == float(host[-1])


def test_get_small_download_path(gpu_lease):
    """GET answers: one cudaMemcpy into pinned memory up to 64 KiB (views made contiguous first),
    the chunked pipeline above; values and dtypes as CuPy has them."""
    from gpuctl.datapath.executor_cupy import SMALL_DOWNLOAD_BYTES

    for dtype in ("bool", "int8", "uint16", "int64", "float16", "float32", "complex128"):
        host = (np.arange(24) % 3).astype(dtype).reshape(4, 6)
        r = cp.asarray(host)
        np.testing.assert_array_equal(r.get(), host)
        np.testing.assert_array_equal(r[:, ::2].T.get(), host[:, ::2].T)  # non-contiguous view
        assert r[1, 2].item() == host[1, 2].item()
    for n in (SMALL_DOWNLOAD_BYTES // 4, SMALL_DOWNLOAD_BYTES // 4 + 1, 0):  # at, above the limit, empty
        host = np.arange(n, dtype=np.float32)
        np.testing.assert_array_equal(cp.asarray(host).get(), host)
    x = cp.zeros((), dtype=cp.float64)
    for i in range(50):  # each float() sees every op queued before it
        x += 1
        assert float(x) == i + 1
