"""gpuctl.remote attached to a real lease worker (tests' side), CuPy-on-a-GPU gating, and the check
that a remote result equals NumPy's."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

import gpuctl.remote as cp
from gpuctl.datapath.testing import running_worker


@contextmanager
def attached(**worker_options) -> Iterator[tuple[object, object]]:
    """Start a lease worker (gpuctl.datapath.testing.running_worker(**worker_options)), attach
    gpuctl.remote to it and yield (worker handle, connection); detached and stopped afterwards."""
    with running_worker(**worker_options) as (handle, url):
        conn = cp.attach(url)
        try:
            yield handle, conn
        finally:
            cp.detach()


def cupy_on_a_gpu():
    """The cupy module; skips the calling test module where CuPy or an NVIDIA GPU is missing."""
    cupy = pytest.importorskip("cupy")
    try:
        gpus = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no driver
        gpus = 0
    if gpus == 0:
        pytest.skip("needs an NVIDIA GPU", allow_module_level=True)
    return cupy


def same(got, want, *, inferred=True, rtol=1e-6):
    """`got` (remote) equals `want` (NumPy): values, shape, dtype; with `inferred`, the client knew
    shape and dtype before fetching anything. Tuples and lists are compared item by item."""
    if isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want)
        for g, w in zip(got, want):
            same(g, w, inferred=inferred, rtol=rtol)
        return
    want = np.asarray(want)
    assert isinstance(got, cp.ndarray), type(got)
    if inferred:
        assert got._shape == want.shape, (got._shape, want.shape)
        assert got._dtype == want.dtype, (got._dtype, want.dtype)
    host = got.get()
    assert host.shape == want.shape and host.dtype == want.dtype, (host.shape, host.dtype, want.shape, want.dtype)
    if want.dtype.kind in "fc":
        np.testing.assert_allclose(host, want, rtol=rtol, atol=rtol)
    else:
        np.testing.assert_array_equal(host, want)
