"""gpuctl.remote.linalg and gpuctl.remote.fft against numpy.linalg / numpy.fft (hypothesis over
shapes and dtypes), through a real NumPy-executor worker."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gpuctl.remote as cp
from remote_lease import attached, same

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FLOATS = st.sampled_from([np.float32, np.float64])


@pytest.fixture(scope="module")
def remote():
    with attached(quota_bytes=256 << 20):
        yield cp


BATCH = st.lists(st.integers(1, 2), max_size=1)


def mats(dtype=FLOATS, square=True, batch=BATCH):
    @st.composite
    def build(draw):
        n = draw(st.integers(1, 5))
        m = n if square else draw(st.integers(1, 5))
        b = tuple(draw(batch))
        dt = draw(dtype)
        return draw(hnp.arrays(dt, b + (m, n), elements=st.floats(-3, 3, width=32)))

    return build()


def spd(a):
    """A well-conditioned symmetric positive definite matrix from `a` (square)."""
    n = a.shape[-1]
    return (a @ np.swapaxes(a, -1, -2) + n * np.eye(n, dtype=a.dtype)).astype(a.dtype)


@SETTINGS
@given(a=mats(square=False), ord_axis=st.sampled_from([(None, None), ("fro", None), (2, -1), (1, 0), (np.inf, -1)]),
       keep=st.booleans())
def test_norm(remote, a, ord_axis, keep):
    ord_, axis = ord_axis
    if ord_ == "fro" and a.ndim > 2:
        axis = (-2, -1)
    same(cp.linalg.norm(cp.asarray(a), ord_, axis, keep), np.asarray(np.linalg.norm(a, ord_, axis, keep)), rtol=1e-4)


@SETTINGS
@given(a=mats())
def test_solve_inv_det_slogdet_cholesky_eigh(remote, a):
    s = spd(a)
    rs = cp.asarray(s)
    b = np.arange(s.shape[-1], dtype=s.dtype)
    if s.ndim == 2:
        same(cp.linalg.solve(rs, cp.asarray(b)), np.linalg.solve(s, b), rtol=1e-3)
    B = np.ones(s.shape[:-1] + (2,), s.dtype)
    same(cp.linalg.solve(rs, cp.asarray(B)), np.linalg.solve(s, B), rtol=1e-3)
    same(cp.linalg.inv(rs), np.linalg.inv(s), rtol=1e-3)
    same(cp.linalg.pinv(rs), np.linalg.pinv(s), rtol=1e-3)
    same(cp.linalg.det(rs), np.asarray(np.linalg.det(s)), rtol=1e-3)
    same(tuple(cp.linalg.slogdet(rs)), tuple(np.asarray(v) for v in np.linalg.slogdet(s)), rtol=1e-3)
    same(cp.linalg.cholesky(rs), np.linalg.cholesky(s), rtol=1e-3)
    w, v = cp.linalg.eigh(rs)
    ww, vv = np.linalg.eigh(s)
    same(w, ww, rtol=1e-3)
    assert v.shape == vv.shape and v.dtype == vv.dtype
    # eigenvectors are defined up to sign: check A v = v w instead
    vh = v.get()
    np.testing.assert_allclose(s @ vh, vh * w.get()[..., None, :], rtol=1e-3, atol=1e-3)
    same(cp.linalg.eigvalsh(rs), np.linalg.eigvalsh(s), rtol=1e-3)
    same(cp.linalg.matrix_rank(rs), np.asarray(np.linalg.matrix_rank(s)))


@SETTINGS
@given(a=mats(square=False), full=st.booleans(), mode=st.sampled_from(["reduced", "complete"]))
def test_svd_qr(remote, a, full, mode):
    ra = cp.asarray(a)
    U, S, Vh = cp.linalg.svd(ra, full_matrices=full)
    u, s, vh = np.linalg.svd(a, full_matrices=full)
    for g, w in ((U, u), (S, s), (Vh, vh)):
        assert (g.shape, g.dtype) == (w.shape, w.dtype)
    same(S, s, rtol=1e-3)
    k = s.shape[-1]
    rebuilt = (U.get()[..., :, :k] * S.get()[..., None, :]) @ Vh.get()[..., :k, :]
    np.testing.assert_allclose(rebuilt, a, rtol=1e-3, atol=1e-3)
    same(cp.linalg.svd(ra, compute_uv=False), np.linalg.svd(a, compute_uv=False), rtol=1e-3)
    Q, R = cp.linalg.qr(ra, mode=mode)
    q, r = np.linalg.qr(a, mode=mode)
    assert (Q.shape, Q.dtype, R.shape, R.dtype) == (q.shape, q.dtype, r.shape, r.dtype)
    np.testing.assert_allclose(Q.get() @ R.get(), a, rtol=1e-3, atol=1e-3)
    assert cp.linalg.qr(ra, mode="r").shape == np.linalg.qr(a, mode="r").shape


def test_linalg_shape_errors_raise_at_the_call(remote):
    v = cp.ones(3)
    with pytest.raises(np.linalg.LinAlgError, match="1-dimensional array given"):
        cp.linalg.inv(v)
    with pytest.raises(cp.linalg.LinAlgError, match="Last 2 dimensions of the array must be square"):
        cp.linalg.det(cp.ones((2, 3)))
    with pytest.raises(ValueError, match="mismatch in its core dimension"):
        cp.linalg.solve(cp.eye(3), cp.ones(4))


def test_singular_matrix_error_names_op_at_next_sync(remote):
    x = cp.linalg.inv(cp.zeros((2, 2)))
    with pytest.raises(np.linalg.LinAlgError, match=r"op #\d+ linalg_inv\(h\d+\): Singular matrix"):
        x.get()
    assert float(cp.ones(2).sum()) == 2.0


CPLX_OR_REAL = st.sampled_from([np.float32, np.float64, np.complex64, np.complex128])


@SETTINGS
@given(a=hnp.arrays(CPLX_OR_REAL, hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6),
                    elements=st.floats(-3, 3, width=32)),
       n=st.one_of(st.none(), st.integers(1, 8)), norm=st.sampled_from([None, "ortho", "forward"]), data=st.data())
def test_fft_family(remote, a, n, norm, data):
    axis = data.draw(st.integers(-a.ndim, a.ndim - 1))
    ra = cp.asarray(a)
    same(cp.fft.fft(ra, n, axis, norm), np.fft.fft(a, n, axis, norm), rtol=1e-4)
    same(cp.fft.ifft(ra, n, axis, norm), np.fft.ifft(a, n, axis, norm), rtol=1e-4)
    if a.dtype.kind == "f":
        same(cp.fft.rfft(ra, n, axis, norm), np.fft.rfft(a, n, axis, norm), rtol=1e-4)
    if a.shape[axis] >= 2 or n is not None:
        same(cp.fft.irfft(ra, n, axis, norm), np.fft.irfft(a, n, axis, norm), rtol=1e-4)
    same(cp.fft.fftn(ra, norm=norm), np.fft.fftn(a, norm=norm), rtol=1e-4)
    same(cp.fft.ifftn(ra), np.fft.ifftn(a), rtol=1e-4)
    if a.ndim >= 2:
        same(cp.fft.fft2(ra), np.fft.fft2(a), rtol=1e-4)
        same(cp.fft.ifft2(ra), np.fft.ifft2(a), rtol=1e-4)
        same(cp.fft.fft2(ra, s=(3, 2)), np.fft.fft2(a, s=(3, 2)), rtol=1e-4, inferred=False)
    if a.dtype.kind == "f":
        same(cp.fft.rfftn(ra), np.fft.rfftn(a), rtol=1e-4)
    same(cp.fft.fftshift(ra), np.fft.fftshift(a))
    same(cp.fft.ifftshift(ra, axes=axis), np.fft.ifftshift(a, axes=axis))


@SETTINGS
@given(n=st.integers(1, 20), d=st.sampled_from([1.0, 0.5, 0.1]))
def test_fftfreq(remote, n, d):
    same(cp.fft.fftfreq(n, d), np.fft.fftfreq(n, d))
    same(cp.fft.rfftfreq(n, d), np.fft.rfftfreq(n, d))


def test_fft_bad_norm_raises_at_the_call(remote):
    with pytest.raises(ValueError, match="Invalid norm value"):
        cp.fft.fft(cp.ones(4), norm="sideways")
