"""The interface every GPU backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod

from gpuctl.model import GpuIdentity, GpuSample


class BackendError(Exception):
    """The backend cannot work at all on this node (e.g. NVML cannot start).

    code: a stable machine-readable code ("nvml_library_not_found", "nvml_driver_not_loaded",
    "nvml_driver_mismatch", "nvml_init_failed"). fix: what the admin should do, in words.
    """

    def __init__(self, message: str, *, code: str = "backend_error", fix: str | None = None):
        super().__init__(message)
        self.code = code
        self.fix = fix


class GpuBackend(ABC):
    """A source of GPU identities and telemetry for one node.

    Called only from the daemon's sampler thread (sample) and at start-up (gpus); never on a
    request path. A GPU that stops answering is reported through `GpuSample.error`, never by
    raising, so one bad GPU never hides the others.
    """

    #: "nvml" or "simulated"
    name: str = "?"

    @abstractmethod
    def gpus(self) -> list[GpuIdentity]:
        """The node's GPUs in index order. Raises BackendError if the backend cannot start."""

    @abstractmethod
    def sample(self) -> list[GpuSample]:
        """One sample per GPU of :meth:`gpus`, same order, taken now (~15 ms per GPU on NVML)."""

    def close(self) -> None:
        """Release the backend (nvmlShutdown); idempotent."""
