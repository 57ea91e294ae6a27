"""Issue 14's names on the CuPy executor (a real GPU; skipped where CuPy or a GPU is missing):
each result equals local CuPy's for the same call, ElementwiseKernel runs, default_rng draws equal
local cupy.random.default_rng's, and OutOfMemoryError raises at the allocating call. No
hypothesis here (the GPU machine may not have it): fixed cases over shapes and dtypes."""

from __future__ import annotations

import numpy as np
import pytest

from remote_lease import attached, cupy_on_a_gpu

cupy = cupy_on_a_gpu()  # skips this module where CuPy or an NVIDIA GPU is missing
pytestmark = pytest.mark.gpu

import gpuctl.remote as cp
from gpuctl.datapath.testing import cuda_device_uuid


@pytest.fixture(scope="module")
def gpu_lease():
    with attached(executor="cupy", gpu_uuid=cuda_device_uuid(), quota_bytes=1 << 30) as (handle, _):
        yield handle


RNG = np.random.default_rng(3)
M = RNG.standard_normal((5, 5))
SPD = (M @ M.T + 5 * np.eye(5))
V = RNG.standard_normal((3, 4, 6))

CASES = {
    "norm": lambda xp, a: xp.linalg.norm(a),
    "norm_axis": lambda xp, a: xp.linalg.norm(a, axis=-1),
    "solve": lambda xp, a: xp.linalg.solve(xp.asarray(SPD), xp.asarray(SPD[:, :2])),
    "inv": lambda xp, a: xp.linalg.inv(xp.asarray(SPD)),
    "det": lambda xp, a: xp.linalg.det(xp.asarray(SPD)),
    "cholesky": lambda xp, a: xp.linalg.cholesky(xp.asarray(SPD)),
    "eigvalsh": lambda xp, a: xp.linalg.eigvalsh(xp.asarray(SPD)),
    "svd_s": lambda xp, a: xp.linalg.svd(xp.asarray(M), compute_uv=False),
    "fft": lambda xp, a: xp.fft.fft(a),
    "rfft_n": lambda xp, a: xp.fft.rfft(a, 8, axis=1),
    "irfft": lambda xp, a: xp.fft.irfft(a),
    "fft2": lambda xp, a: xp.fft.fft2(a),
    "fftn_f32": lambda xp, a: xp.fft.fftn(a.astype(xp.float32)),
    "fftshift": lambda xp, a: xp.fft.fftshift(a),
    "pad": lambda xp, a: xp.pad(a, ((0, 1), (2, 0), (1, 1)), mode="reflect"),
    "tile": lambda xp, a: xp.tile(a, (2, 1, 1)),
    "repeat": lambda xp, a: xp.repeat(a, 3, axis=1),
    "flip_roll": lambda xp, a: xp.roll(xp.flip(a, 0), 2, axis=2),
    "moveaxis": lambda xp, a: xp.moveaxis(a, 0, -1),
    "take": lambda xp, a: xp.take(a, xp.asarray([0, 2, 5]), axis=2),
    "take_along_axis": lambda xp, a: xp.take_along_axis(a, xp.argsort(a, axis=1), axis=1),
    "nonzero": lambda xp, a: xp.nonzero(a > 0.5),
    "count_nonzero": lambda xp, a: xp.count_nonzero(a > 0, axis=1),
    "searchsorted": lambda xp, a: xp.searchsorted(xp.sort(a.ravel()), xp.asarray([-1.0, 0.0, 1.0])),
    "unique_counts": lambda xp, a: xp.unique(xp.round(a), return_counts=True),
    "diag_trace": lambda xp, a: (xp.diag(a[0]), xp.trace(a[0]), xp.tril(a[0], -1), xp.triu(a[0], 1)),
    "meshgrid": lambda xp, a: xp.meshgrid(a[0, 0], a[1, 1]),
    "diff_cumprod": lambda xp, a: (xp.diff(a, 2, axis=-1), xp.cumprod(a, axis=0)),
    "percentile": lambda xp, a: xp.percentile(a, xp.asarray([10.0, 50.0]), axis=1),
    "histogram": lambda xp, a: xp.histogram(a, 7),
    "bincount": lambda xp, a: xp.bincount(xp.abs(a * 3).astype(xp.int64).ravel()),
    "allclose": lambda xp, a: (xp.allclose(a, a + 1e-9), xp.array_equal(a, a)),
    "broadcast": lambda xp, a: xp.broadcast_arrays(a, a[0]),
    "complex": lambda xp, a: (xp.real(a + 2j * a), xp.imag(a + 2j * a), xp.conj(a + 2j * a)),
    "round_nan": lambda xp, a: (xp.round(a, 2), xp.nan_to_num(a / (a > 0))),
    "logaddexp": lambda xp, a: xp.logaddexp(a, a[::-1]),
    "astype": lambda xp, a: xp.astype(a, xp.float16) if hasattr(xp, "astype") else a.astype(xp.float16),
    "where_one_arg": lambda xp, a: xp.where(a > 1),
    "argmax_keepdims": lambda xp, a: xp.argmax(a, axis=1, keepdims=True),
    "mT": lambda xp, a: a.mT if hasattr(a, "mT") else xp.swapaxes(a, -1, -2),
    "arange_float_stop": lambda xp, a: xp.arange(1, 2.5),
}


def _flat(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


@pytest.mark.parametrize("case", sorted(CASES))
def test_equals_local_cupy(gpu_lease, case):
    fn = CASES[case]
    with np.errstate(all="ignore"):
        want = _flat(fn(cupy, cupy.asarray(V)))
        got = _flat(fn(cp, cp.asarray(V)))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = cupy.asnumpy(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (case, g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(g.get(), w, rtol=1e-4, atol=1e-4, err_msg=case)


def test_elementwise_kernel_runs_on_the_worker(gpu_lease):
    k = cp.ElementwiseKernel("float32 x, float32 y", "float32 z", "z = x * y + 1", "fma_one")
    x = cp.arange(6, dtype=cp.float32)
    z = k(x, x)
    np.testing.assert_allclose(z.get(), np.arange(6, dtype=np.float32) ** 2 + 1)
    out = cp.zeros(6, dtype=cp.float32)
    k(x, x, out)
    np.testing.assert_allclose(out.get(), z.get())


def test_default_rng_equals_local_cupy(gpu_lease):
    g, w = cp.random.default_rng(7), cupy.random.default_rng(7)
    np.testing.assert_array_equal(g.random(5).get(), cupy.asnumpy(w.random(5)))
    np.testing.assert_array_equal(g.standard_normal((2, 2)).get(), cupy.asnumpy(w.standard_normal((2, 2))))


def test_out_of_memory_at_the_allocating_call(gpu_lease):
    with pytest.raises(cp.cuda.memory.OutOfMemoryError, match=r"^zeros\(.*slice memory quota exceeded"):
        cp.zeros(30 << 28, dtype=cp.float32)  # 30 GiB in a 1 GiB slice
    assert float(cp.ones(4).sum()) == 4.0
