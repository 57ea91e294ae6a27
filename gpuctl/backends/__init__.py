"""GPU backends: where a node's GPU identities and telemetry samples come from.

`nvml` reads real GPUs through nvidia-ml-py; `simulated` invents a deterministic, realistic fleet.
Both implement :class:`gpuctl.backends.base.GpuBackend`.
"""

from gpuctl.backends.base import BackendError, GpuBackend

__all__ = ["BackendError", "GpuBackend", "make_backend"]


def make_backend(kind: str, *, gpus: int = 8, seed: int = 0) -> GpuBackend:
    """Build the backend named `kind` ("nvml", "simulated" or "auto").

    "auto" picks nvml where NVML starts; otherwise it raises BackendError saying why (it never
    falls back to simulated silently). Raises BackendError (with `.code` and `.fix`) when NVML
    cannot start, ValueError for an unknown kind.
    """
    if kind == "simulated":
        from gpuctl.backends.simulated import SimulatedBackend

        return SimulatedBackend(gpus=gpus, seed=seed)
    if kind in ("nvml", "auto"):
        from gpuctl.backends.nvml import NvmlBackend

        return NvmlBackend()
    raise ValueError(f"unknown backend {kind!r}: choose auto, nvml or simulated")
