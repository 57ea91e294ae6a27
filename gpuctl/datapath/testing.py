"""Helpers for tests and benchmarks: a NumPy-executor worker of a made-up lease, cleaned up on exit."""

from __future__ import annotations

import contextlib
import secrets
import time
from typing import Iterator

from gpuctl.datapath.launcher import WorkerHandle, start_worker


@contextlib.contextmanager
def running_worker(*, quota_bytes: int = 64 << 20, ttl_s: float = 300.0, executor: str = "numpy",
                   lease_id: str | None = None, gpu_uuid: str | None = None, compute_share: float = 1.0,
                   **kwargs) -> Iterator[tuple[WorkerHandle, str]]:
    """Start a worker for a fresh lease and yield (handle, attach URL); always stopped afterwards."""
    lease_id = lease_id or f"test-{secrets.token_hex(3)}"
    token = secrets.token_bytes(32)
    handle = start_worker(lease_id=lease_id, token=token, quota_bytes=quota_bytes, compute_share=compute_share,
                          executor=executor, gpu_uuid=gpu_uuid, expires_at_s=time.time() + ttl_s, **kwargs)
    scheme = "tls" if kwargs.get("tls_cert") else "tcp"
    url = f"{scheme}://{handle.endpoint}?lease={lease_id}&token={token.hex()}"
    try:
        yield handle, url
    finally:
        handle.stop()


def cuda_device_uuid(index: int = 0) -> str:
    """CUDA device `index`'s UUID as NVML writes it (``GPU-`` 8-4-4-4-12 hex), from CuPy's device
    properties: workers are pinned by UUID, never by index. Raises ImportError without CuPy."""
    import cupy

    h = bytes(cupy.cuda.runtime.getDeviceProperties(index)["uuid"]).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
