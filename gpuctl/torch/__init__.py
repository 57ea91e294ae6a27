"""gpuctl.torch: plain PyTorch training code on a leased remote GPU slice, from a machine with no GPU.

The one-line change::

    import gpuctl.torch
    device = gpuctl.torch.device()          # attaches from GPUCTL_ATTACH (set by `gpuctl run`)
    model.to(device); x = x.to(device); torch.randn(3, device=device)

Tensors on ``device`` (``gpuctl:0``) live in the lease's worker; the client keeps only their shape,
strides and dtype. Autograd, torch.optim, losses, ``torch.autocast(device.type, dtype=...)``,
in-place ops, views and indexing, ``manual_seed``, ``no_grad`` and gradient clipping run
unchanged; ops are sent without waiting, and only ``.item()``, ``.cpu()``, ``.tolist()``,
printing and ``torch.gpuctl.synchronize()`` wait for the worker. An op the worker does not
allow raises NotImplementedError naming it at the call; shape and dtype errors raise at the call;
an op failing on the worker (e.g. ``torch.OutOfMemoryError`` past the slice's memory quota)
raises at the next synchronization point. Mechanism: gpuctl/torch/_tensor.py; protocol:
docs/DATAPATH.md "PyTorch".

Needs the extra ``gpuctl[torch]`` (torch 2.9 or later on the client). Differences from CUDA:
``torch.autocast`` must be given ``device.type`` ("gpuctl"), not "cuda"; attention runs the
math path (no fused kernels); no streams, events, CUDA graphs or ``generator=`` arguments;
``torch.load(..., map_location=device)`` is not supported (load to CPU, then ``.to(device)`` or
``load_state_dict``).
"""

from __future__ import annotations

from typing import Any

import torch

from gpuctl.remote._connection import AttachError, Connection, WorkerLostError, resolve_attach
from gpuctl.torch import _backend, _tensor
from gpuctl.torch._tensor import RemoteTensor, WorkerLost

__all__ = ["attach", "detach", "device", "is_attached", "stats", "synchronize", "RemoteTensor", "AttachError",
           "WorkerLostError", "WorkerLost"]

_pending_seed: list[int] = []
#: Seconds the handshake may take (the worker imports torch and initializes CUDA at the first one).
ATTACH_TIMEOUT_S = 120.0


def _seed(seed: int) -> None:
    c = _tensor.link.conn
    if c is None:
        _pending_seed[:] = [seed]
    else:
        c.enqueue("t.seed", [], [seed])


def synchronize() -> None:
    """Wait until the worker has run every op sent so far. Raises the first error of those ops
    (RuntimeError, torch.OutOfMemoryError, ... naming the op) or WorkerLostError."""
    _tensor._sync_call(_tensor.conn(), "sync", [])


def _setup() -> None:
    _backend.setup(_tensor.empty_memory_format, _tensor.empty_strided, _tensor.factory_kernel,
                   _tensor.RESIZING_FACTORIES)
    _backend._BackendModule.seed_hook = staticmethod(_seed)
    _backend._BackendModule.sync_hook = staticmethod(synchronize)


def attach(endpoint: str | None = None, token: str | bytes | None = None, lease_id: str | None = None, *,
           ssh: Any = None) -> torch.device:
    """Attach to a lease's worker and return its device (``gpuctl:0``).

    `endpoint`: a ``tcp://``, ``tls://`` or ``ssh://`` attach URL (docs/DATAPATH.md), or HOST:PORT
    with `token` (hex) and `lease_id`; None reads ``GPUCTL_ATTACH``. `ssh`: an open paramiko
    Transport/SSHClient to the node. Raises AttachError (bad URL, refused token, unreachable worker,
    a worker that cannot run torch) and RuntimeError when the device cannot be registered.
    """
    spec = resolve_attach(endpoint, token, lease_id, api="gpuctl.torch")
    _setup()
    # the worker starts torch (and CUDA) at its first torch connection: allow it time to answer
    conn = Connection(spec, timeout_s=ATTACH_TIMEOUT_S, ssh=ssh, hello={"client": "gpuctl.torch", "executor": "torch"})
    if conn.executor != "torch":
        conn.close()
        raise AttachError(f"the worker of lease {spec.lease_id} at {conn.endpoint} does not run gpuctl.torch "
                          f"(it answered executor {conn.executor!r}; update gpuctld on the node)")
    old, _tensor.link.conn = _tensor.link.conn, conn
    if old is not None:
        old.close()
    if _pending_seed:
        conn.enqueue("t.seed", [], [_pending_seed.pop()])
    return _tensor._DEVICE


def device() -> torch.device:
    """The leased slice as a torch.device (``gpuctl:0``), attaching from GPUCTL_ATTACH on first use."""
    if _tensor.link.conn is None:
        return attach()
    return _tensor._DEVICE


def is_attached() -> bool:
    """True while a connection to a lease's worker is open."""
    c = _tensor.link.conn
    return c is not None and c.lost is None


def stats() -> dict[str, Any]:
    """The worker's counters for this lease (a synchronization point): memory_in_use_bytes,
    peak_memory_bytes, quota_bytes, ops_total, bytes_in, bytes_out, ... (accounting.snapshot)."""
    return _tensor._sync_call(_tensor.conn(), "stats", [])


def detach() -> None:
    """Close the connection (the worker frees this connection's tensors)."""
    c, _tensor.link.conn = _tensor.link.conn, None
    if c is not None:
        c.close()
