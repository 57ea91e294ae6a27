"""The real-GPU backend: GPU identities and telemetry read through NVML (nvidia-ml-py, ``import pynvml``).

Every NVML call goes through one wrapper, :meth:`NvmlBackend._query`, which turns each NVML error
into one of three outcomes (the idea of nvitop's ``nvitop/api/libnvml.py``):

- a value: the call answered;
- :class:`Unavailable`: the figure is N/A (NotSupported, NotFound, a function missing from an old
  driver, no permission, ...). The field becomes None, the rest of the sample is kept, and the
  cause is logged once per (GPU, function), not on every poll. A function missing from the driver
  (``NVML_ERROR_FUNCTION_NOT_FOUND``) is remembered and never called again;
- :class:`GpuLostError` (internal): ``NVML_ERROR_GPU_IS_LOST``, or ``NVML_ERROR_UNKNOWN`` on a
  device handle. That GPU's samples carry ``error="lost: node needs reboot"`` with every figure
  None, and its handle is never used again; the other GPUs keep reporting.

Units are converted here, at the boundary: bytes, W (NVML gives mW), MHz, °C, %. Out-of-range
readings (utilization > 100 or 0xFFFFFFFF, memory used > total or 2**64-1, total 0, ...) become
None and are counted in ``GpuSample.quality_events``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

import pynvml

from gpuctl.backends.base import BackendError, GpuBackend
from gpuctl.backends.nvml_processes import validate_processes
from gpuctl.model import GpuIdentity, GpuSample

log = logging.getLogger(__name__)

#: GpuSample.error of a GPU that fell off the bus (NVML_ERROR_GPU_IS_LOST / NVML_ERROR_UNKNOWN).
LOST_ERROR = "lost: node needs reboot"

#: GpuSample.processes_error when the driver lacks nvmlDeviceGetComputeRunningProcesses.
PROCESSES_DRIVER_TOO_OLD = "process list unavailable (driver too old)"

#: nvmlInit error -> (BackendError.code, BackendError.fix).
INIT_FAILURES: dict[int, tuple[str, str]] = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: ("nvml_library_not_found", "install the NVIDIA driver"),
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: (
        "nvml_driver_not_loaded",
        "load the kernel module (driver not loaded)",
    ),
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "nvml_driver_mismatch",
        "reboot: driver upgraded without reboot",
    ),
}
#: Code and fix of any other nvmlInit (or device enumeration) failure.
INIT_FAILED = ("nvml_init_failed", "check the NVIDIA driver with `nvidia-smi`")

_U32_NA = 0xFFFFFFFF  # NVML's "value not available" for unsigned int fields
_U64_NA = 2**64 - 1  # the same for unsigned long long fields
_MAX_POWER_MW = 5_000_000  # 5 kW: no single GPU draws more; anything above is a bad reading
_MAX_TEMPERATURE_C = 200
_MAX_CLOCK_MHZ = 20_000
_MAX_PID = 4_194_304  # PID_MAX_LIMIT on 64-bit Linux: a larger pid is a driver bug

# Errors after which a memory v2 query is not retried on that GPU (v1 is used instead).
_V2_UNUSABLE = {
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_INVALID_ARGUMENT,
    getattr(pynvml, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", 25),
}


def _instance_id(value: Any) -> int | None:
    """A MIG GPU/compute instance id, or None when N/A or 0xFFFFFFFF (NVML's "not MIG")."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _U32_NA:
        return value
    return None


def nvml_error_name(code: int | None) -> str:
    """The NVML constant naming error `code`, e.g. 15 -> "NVML_ERROR_GPU_IS_LOST" (or "NVML error N")."""
    for name in dir(pynvml):
        if name.startswith("NVML_ERROR_") and getattr(pynvml, name) == code:
            return name
    return f"NVML error {code}"


def _describe(err: BaseException) -> str:
    """`err` in words with its NVML constant: "GPU is lost (NVML_ERROR_GPU_IS_LOST)"."""
    code = getattr(err, "value", None)
    try:
        text = str(err)
    except Exception:  # pynvml's __str__ may call into NVML
        text = "NVML error"
    return f"{text} ({nvml_error_name(code)})"


def to_text(value: Any) -> str:
    """NVML text (str, or bytes from older bindings, possibly invalid UTF-8) as str.

    Bytes are decoded as UTF-8 with replacement characters; never raises.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


@dataclass(frozen=True)
class Unavailable:
    """A figure NVML did not give: `function` failed with NVML error `code`; `reason` in words."""

    function: str
    code: int | None
    reason: str


class GpuLostError(Exception):
    """Raised inside the backend when a call on a GPU's handle says the GPU is lost."""


@dataclass
class _Gpu:
    """The backend's record of one GPU: its NVML handle (None once lost) and its identity."""

    index: int
    handle: Any
    identity: GpuIdentity
    error: str | None = None  # set once the GPU is lost or unusable: every sample carries it
    memory_v2_ok: bool = True

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.identity.uuid})"


class NvmlBackend(GpuBackend):
    """GPU identities and telemetry of this node's NVIDIA GPUs, read through NVML.

    The constructor calls nvmlInit and enumerates the GPUs (nvmlDeviceGetCount,
    nvmlDeviceGetHandleByIndex). Raises :class:`BackendError` when NVML cannot start, with
    ``code``/``fix``: NVML_ERROR_LIBRARY_NOT_FOUND -> "nvml_library_not_found" ("install the NVIDIA
    driver"); NVML_ERROR_DRIVER_NOT_LOADED -> "nvml_driver_not_loaded" ("load the kernel module
    (driver not loaded)"); NVML_ERROR_LIB_RM_VERSION_MISMATCH -> "nvml_driver_mismatch" ("reboot:
    driver upgraded without reboot"); anything else -> "nvml_init_failed".

    A GPU whose handle cannot be had at start-up is still listed, with uuid "lost-index-N" (GPU
    lost) or "unavailable-index-N" (another error), and its samples carry the error; it never
    stops the others. Thread-safe (one lock); meant to be called from the daemon's sampler thread.
    """

    name = "nvml"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._missing_functions: set[str] = set()  # FUNCTION_NOT_FOUND: never called again
        self._logged: set[tuple[str, str]] = set()  # (GPU label, function/topic) logged once
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            code, fix = INIT_FAILURES.get(getattr(err, "value", None), INIT_FAILED)
            raise BackendError(
                f"NVML could not start: nvmlInit failed: {_describe(err)}; fix: {fix}",
                code=code,
                fix=fix,
            ) from err
        try:
            self._gpus = self._enumerate()
        except BaseException:
            self._shutdown()
            raise

    # ---- the one wrapper around every NVML call -------------------------------------------

    def _log_once(self, gpu: _Gpu | None, topic: str, level: int, message: str) -> None:
        """Log `message` the first time (GPU, topic) is seen; later repeats are silent."""
        key = (gpu.label if gpu else "node", topic)
        if key in self._logged:
            return
        self._logged.add(key)
        log.log(level, "%s: %s", key[0], message)

    def _query(self, gpu: _Gpu | None, function: str, *args: Any, key: str | None = None, **kwargs: Any) -> Any:
        """Call ``pynvml.<function>(*args, **kwargs)``; its value, or :class:`Unavailable`.

        `key` names the driver function for the "missing from the driver" memory (default:
        `function`; e.g. "nvmlDeviceGetMemoryInfo_v2"). Raises :class:`GpuLostError` when `gpu`
        is given and NVML says GPU_IS_LOST or UNKNOWN (the GPU is then marked lost).
        """
        key = key or function
        if key in self._missing_functions:
            return Unavailable(function, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, "function not in this driver")
        try:
            return getattr(pynvml, function)(*args, **kwargs)
        except pynvml.NVMLError as err:
            code = getattr(err, "value", None)
            if gpu is not None and code in (pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_UNKNOWN):
                self._mark_lost(gpu, function, err)
                raise GpuLostError(gpu.label) from err
            if code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                self._missing_functions.add(key)
                self._log_once(None, key, logging.WARNING, f"{key} is not in this NVIDIA driver; not called again")
                return Unavailable(function, code, "function not in this driver")
            level = logging.INFO if code in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NOT_FOUND) else logging.WARNING
            self._log_once(gpu, key, level, f"{function}: {_describe(err)}; shown as N/A")
            return Unavailable(function, code, _describe(err))

    def _mark_lost(self, gpu: _Gpu, function: str, err: BaseException) -> None:
        """Forget `gpu`'s handle for good; its samples say :data:`LOST_ERROR` from now on."""
        gpu.handle = None
        gpu.error = LOST_ERROR
        self._log_once(gpu, "lost", logging.ERROR, f"{function}: {_describe(err)}; {LOST_ERROR}; not queried again")

    # ---- identities ----------------------------------------------------------------------

    def _enumerate(self) -> list[_Gpu]:
        """One :class:`_Gpu` per NVML index (nvmlDeviceGetCount). Raises BackendError if uncountable."""
        count = self._query(None, "nvmlDeviceGetCount")
        if isinstance(count, Unavailable):
            code, fix = INIT_FAILED
            raise BackendError(
                f"NVML could not start: nvmlDeviceGetCount failed: {count.reason}; fix: {fix}",
                code=code,
                fix=fix,
            )
        gpus = []
        for index in range(int(count)):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            except pynvml.NVMLError as err:
                gpus.append(self._unreachable_gpu(index, err))
                continue
            gpu = self._identify(index, handle)
            gpus.append(gpu)
            if gpu.identity.mig_enabled and gpu.error is None:
                gpus.extend(self._mig_devices(gpu))
        self._add_links([g for g in gpus if g.handle is not None and g.error is None
                         and not g.identity.is_mig_device])
        return gpus

    def _add_links(self, gpus: list[_Gpu]) -> None:
        """Set each GPU's ``peer_links`` (peer UUID -> a gpuctl.model.GPU_LINKS name): "nvlink" when
        nvmlDeviceGetP2PStatus(NVLINK) says OK, else the level of nvmlDeviceGetTopologyCommonAncestor.
        A pair neither query answers is left out; a GPU with no answered pair keeps None."""
        levels = {pynvml.NVML_TOPOLOGY_INTERNAL: "board", pynvml.NVML_TOPOLOGY_SINGLE: "pcie_switch",
                  pynvml.NVML_TOPOLOGY_MULTIPLE: "pcie_switches", pynvml.NVML_TOPOLOGY_HOSTBRIDGE: "host_bridge",
                  pynvml.NVML_TOPOLOGY_NODE: "numa_node", pynvml.NVML_TOPOLOGY_SYSTEM: "system"}
        links: dict[str, dict[str, str]] = {}
        for i, a in enumerate(gpus):
            for b in gpus[i + 1:]:
                p2p = self._query(None, "nvmlDeviceGetP2PStatus", a.handle, b.handle,
                                  pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                if not isinstance(p2p, Unavailable) and p2p == pynvml.NVML_P2P_STATUS_OK:
                    link: str | None = "nvlink"
                else:
                    level = self._query(None, "nvmlDeviceGetTopologyCommonAncestor", a.handle, b.handle)
                    link = None if isinstance(level, Unavailable) else levels.get(int(level))
                if link is not None:
                    links.setdefault(a.identity.uuid, {})[b.identity.uuid] = link
                    links.setdefault(b.identity.uuid, {})[a.identity.uuid] = link
        for g in gpus:
            if g.identity.uuid in links:
                g.identity = replace(g.identity, peer_links=links[g.identity.uuid])

    def _mig_devices(self, parent: _Gpu) -> list[_Gpu]:
        """The MIG devices of `parent` (MIG on), in MIG index order, each a :class:`_Gpu` of its own.

        nvmlDeviceGetMaxMigDeviceCount gives the slots; nvmlDeviceGetMigDeviceHandleByIndex each
        device (NVML_ERROR_NOT_FOUND: an empty slot, skipped). Per device: UUID ("MIG-..."), name,
        memory (nvmlDeviceGetMemoryInfo on the MIG handle, bytes), GPU instance and compute
        instance ids (nvmlDeviceGetGpuInstanceId / nvmlDeviceGetComputeInstanceId; 0xFFFFFFFF,
        "not MIG", becomes None), and its compute share (nvmlDeviceGetAttributes
        computeInstanceSliceCount / max MIG device count; None if unknown). A parent that is lost
        on the way gives no devices; a device that is lost is listed with its error.
        """
        try:
            slots = self._query(parent, "nvmlDeviceGetMaxMigDeviceCount", parent.handle)
        except GpuLostError:
            return []
        if isinstance(slots, Unavailable) or not isinstance(slots, int) or not 0 < slots < 64:
            self._log_once(parent, "mig", logging.WARNING,
                           f"MIG is on but its device count is unknown ({slots!r}): no MIG slices")
            return []
        devices: list[_Gpu] = []
        for i in range(slots):
            try:
                handle = self._query(parent, "nvmlDeviceGetMigDeviceHandleByIndex", parent.handle, i)
            except GpuLostError:
                return devices
            if isinstance(handle, Unavailable):
                continue  # NOT_FOUND: no MIG device in that slot (others were logged once)
            devices.append(self._identify_mig(parent, i, handle, slots))
        return devices

    def _identify_mig(self, parent: _Gpu, mig_index: int, handle: Any, slots: int) -> _Gpu:
        """Read one MIG device's identity; see :meth:`_mig_devices`."""
        p = parent.identity
        gpu = _Gpu(p.index, handle, GpuIdentity(uuid=f"unknown-mig-{p.index}-{mig_index}", index=p.index,
                                                 name="unknown", parent_uuid=p.uuid))
        try:
            uuid = self._text_query(gpu, "nvmlDeviceGetUUID", handle) or gpu.identity.uuid
            name = self._text_query(gpu, "nvmlDeviceGetName", handle) or f"{p.name} MIG"
            memory = self._memory(gpu)
            gi = _instance_id(self._query(gpu, "nvmlDeviceGetGpuInstanceId", handle))
            ci = _instance_id(self._query(gpu, "nvmlDeviceGetComputeInstanceId", handle))
            attrs = self._query(gpu, "nvmlDeviceGetAttributes", handle)
        except GpuLostError:
            return gpu
        ci_slices = None if isinstance(attrs, Unavailable) else getattr(attrs, "computeInstanceSliceCount", None)
        share = ci_slices / slots if isinstance(ci_slices, int) and 0 < ci_slices <= slots else None
        gpu.identity = GpuIdentity(
            uuid=uuid, index=p.index, name=name, pci_bus_id=p.pci_bus_id,
            memory_total_bytes=memory["memory_total_bytes"], mig_enabled=None, parent_uuid=p.uuid,
            mig_gpu_instance_id=gi, mig_compute_instance_id=ci, mig_compute_share=share,
        )
        return gpu

    def _unreachable_gpu(self, index: int, err: BaseException) -> _Gpu:
        """The record of a GPU whose nvmlDeviceGetHandleByIndex(`index`) failed with `err`."""
        lost = getattr(err, "value", None) in (pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_UNKNOWN)
        uuid = f"lost-index-{index}" if lost else f"unavailable-index-{index}"
        error = LOST_ERROR if lost else f"unavailable: nvmlDeviceGetHandleByIndex({index}) failed: {_describe(err)}"
        gpu = _Gpu(index, None, GpuIdentity(uuid=uuid, index=index, name="unknown"), error=error)
        self._log_once(gpu, "handle", logging.ERROR, f"nvmlDeviceGetHandleByIndex({index}): {_describe(err)}; {error}")
        return gpu

    def _identify(self, index: int, handle: Any) -> _Gpu:
        """Read one GPU's identity (UUID, name, PCI bus id, memory total, MIG mode)."""
        gpu = _Gpu(index, handle, GpuIdentity(uuid=f"unknown-index-{index}", index=index, name="unknown"))
        try:
            uuid = self._text_query(gpu, "nvmlDeviceGetUUID", handle)
            if uuid is not None:
                gpu.identity = GpuIdentity(uuid=uuid, index=index, name="unknown")
            name = self._text_query(gpu, "nvmlDeviceGetName", handle)
            pci = self._query(gpu, "nvmlDeviceGetPciInfo", handle)
            bus_id = None if isinstance(pci, Unavailable) else to_text(getattr(pci, "busId", None) or "") or None
            memory = self._memory(gpu)
            mig = self._query(gpu, "nvmlDeviceGetMigMode", handle)
            mig_enabled = None if isinstance(mig, Unavailable) else mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE
        except GpuLostError:
            ident = gpu.identity
            uuid = ident.uuid if not ident.uuid.startswith("unknown-") else f"lost-index-{index}"
            gpu.identity = GpuIdentity(uuid=uuid, index=index, name=ident.name)
            return gpu
        gpu.identity = GpuIdentity(
            uuid=gpu.identity.uuid,
            index=index,
            name=name if name is not None else "unknown",
            pci_bus_id=bus_id,
            memory_total_bytes=memory["memory_total_bytes"],
            mig_enabled=mig_enabled,
        )
        return gpu

    def _text_query(self, gpu: _Gpu, function: str, *args: Any) -> str | None:
        """A text figure (UUID, name) as str, None when N/A; invalid UTF-8 gets replacement characters."""
        try:
            value = self._query(gpu, function, *args)
        except UnicodeDecodeError as err:  # bindings that decode inside pynvml
            return to_text(err.object)
        return None if isinstance(value, Unavailable) else to_text(value)

    def gpus(self) -> list[GpuIdentity]:
        """The node's GPUs in NVML index order (read once, at construction); after a GPU with MIG
        on come its MIG devices (``parent_uuid`` set; see :meth:`_mig_devices`).

        uuid: nvmlDeviceGetUUID; name: nvmlDeviceGetName (always str); pci_bus_id:
        nvmlDeviceGetPciInfo().busId; memory_total_bytes: nvmlDeviceGetMemoryInfo (v2 where the
        driver has it), bytes; mig_enabled: nvmlDeviceGetMigMode()[0] (current mode).
        """
        with self._lock:
            return [g.identity for g in self._gpus]

    # ---- telemetry -----------------------------------------------------------------------

    def sample(self) -> list[GpuSample]:
        """One :class:`GpuSample` per GPU, same order as :meth:`gpus`, taken now.

        Figures and their NVML source: sm_util_pct / memory_util_pct (%, nvmlDeviceGetUtilizationRates
        .gpu / .memory); memory_used_bytes / memory_reserved_bytes / memory_total_bytes (bytes,
        nvmlDeviceGetMemoryInfo v2, else v1 with reserved None); temperature_c (°C,
        nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)); power_w (W, nvmlDeviceGetPowerUsage mW /
        1000); sm_clock_mhz (MHz, nvmlDeviceGetClockInfo(NVML_CLOCK_SM)); process_count
        (valid entries of nvmlDeviceGetComputeRunningProcesses); process_memory_used_bytes (their
        usedGpuMemory summed, bytes; None when one is N/A). N/A figures are None, out-of-range ones None
        and counted in quality_events. Never raises for a GPU's trouble; raises BackendError
        (code "nvml_closed") after :meth:`close`.
        """
        with self._lock:
            if self._closed:
                raise BackendError("NVML backend is closed: sample() after close()", code="nvml_closed")
            return [self._sample_one(gpu) for gpu in self._gpus]

    def _sample_one(self, gpu: _Gpu) -> GpuSample:
        """Sample one GPU; a lost GPU gives only its error and costs no NVML call."""
        now = time.time()
        uuid = gpu.identity.uuid
        if gpu.error is not None or gpu.handle is None:
            return GpuSample(uuid=uuid, timestamp_s=now, error=gpu.error or LOST_ERROR)
        try:
            figures: dict[str, Any] = {"quality_events": 0}
            figures.update(self._utilization(gpu, figures))
            memory = self._memory(gpu)
            figures["quality_events"] += memory.pop("quality_events")
            figures.update(memory)
            figures["temperature_c"] = self._bounded(
                gpu, figures, "temperature_c",
                self._query(gpu, "nvmlDeviceGetTemperature", gpu.handle, pynvml.NVML_TEMPERATURE_GPU),
                0, _MAX_TEMPERATURE_C,
            )
            power_mw = self._bounded(
                gpu, figures, "power_w", self._query(gpu, "nvmlDeviceGetPowerUsage", gpu.handle), 0, _MAX_POWER_MW
            )
            figures["power_w"] = None if power_mw is None else power_mw / 1000.0
            figures["sm_clock_mhz"] = self._bounded(
                gpu, figures, "sm_clock_mhz",
                self._query(gpu, "nvmlDeviceGetClockInfo", gpu.handle, pynvml.NVML_CLOCK_SM),
                0, _MAX_CLOCK_MHZ,
            )
            processes = self._processes(gpu)
            figures["quality_events"] += processes.pop("quality_events", 0)
            figures.update(processes)
        except GpuLostError:
            return GpuSample(uuid=uuid, timestamp_s=now, error=LOST_ERROR)
        except Exception as exc:  # a binding bug must not hide the other GPUs
            self._log_once(gpu, "unexpected", logging.ERROR, f"sampling failed: {exc!r}")
            return GpuSample(uuid=uuid, timestamp_s=now, error=f"sample failed: {type(exc).__name__}: {exc}")
        return GpuSample(uuid=uuid, timestamp_s=now, **figures)

    def _bounded(self, gpu: _Gpu, figures: dict[str, Any], field: str, value: Any, low: int, high: int) -> int | None:
        """`value` if it is a number in [low, high]; else None (out of range adds a quality event)."""
        if isinstance(value, Unavailable) or value is None:
            return None
        if isinstance(value, (int, float)) and low <= value <= high:
            return value
        figures["quality_events"] += 1
        self._log_once(gpu, f"range:{field}", logging.WARNING, f"{field}: impossible reading {value!r} shown as N/A")
        return None

    def _utilization(self, gpu: _Gpu, figures: dict[str, Any]) -> dict[str, Any]:
        """sm_util_pct, memory_util_pct (%) from nvmlDeviceGetUtilizationRates (.gpu, .memory)."""
        rates = self._query(gpu, "nvmlDeviceGetUtilizationRates", gpu.handle)
        if isinstance(rates, Unavailable):
            return {"sm_util_pct": None, "memory_util_pct": None}
        return {
            "sm_util_pct": self._bounded(gpu, figures, "sm_util_pct", getattr(rates, "gpu", None), 0, 100),
            "memory_util_pct": self._bounded(gpu, figures, "memory_util_pct", getattr(rates, "memory", None), 0, 100),
        }

    def _memory(self, gpu: _Gpu) -> dict[str, Any]:
        """memory_total/used/reserved_bytes (bytes) and the quality events of that reading.

        Prefers nvmlDeviceGetMemoryInfo(handle, version=nvmlMemory_v2) (used excludes reserved);
        falls back to v1 (reserved None) where v2 is missing or refused. Impossible figures
        (total 0 or 2**64-1; used or reserved 2**64-1 or above total; used + reserved > total)
        become None, each counted as a quality event, and are logged once.
        """
        out: dict[str, Any] = {
            "memory_total_bytes": None, "memory_used_bytes": None, "memory_reserved_bytes": None, "quality_events": 0,
        }
        info: Any = None
        version = getattr(pynvml, "nvmlMemory_v2", None)
        if gpu.memory_v2_ok and version is not None:
            info = self._query(gpu, "nvmlDeviceGetMemoryInfo", gpu.handle, version=version, key="nvmlDeviceGetMemoryInfo_v2")
            if isinstance(info, Unavailable):
                if info.code in _V2_UNUSABLE:
                    gpu.memory_v2_ok = False
                info = None
        if info is None:
            info = self._query(gpu, "nvmlDeviceGetMemoryInfo", gpu.handle)
            if isinstance(info, Unavailable):
                return out
            reserved = None
        else:
            reserved = getattr(info, "reserved", None)
        total, used = getattr(info, "total", None), getattr(info, "used", None)
        bad: list[str] = []
        if not isinstance(total, int) or total <= 0 or total >= _U64_NA:
            bad.append(f"total {total!r}")
            total = used = reserved = None
        else:
            if used is not None and (not isinstance(used, int) or not 0 <= used <= total):
                bad.append(f"used {used!r} of total {total}")
                used = None
            if reserved is not None and (not isinstance(reserved, int) or not 0 <= reserved <= total):
                bad.append(f"reserved {reserved!r} of total {total}")
                reserved = None
            if used is not None and reserved is not None and used + reserved > total:
                bad.append(f"used {used} + reserved {reserved} > total {total}")
                used = reserved = None
        if bad:
            out["quality_events"] = len(bad)
            self._log_once(gpu, "range:memory", logging.WARNING,
                           f"nvmlDeviceGetMemoryInfo gave impossible figures ({'; '.join(bad)}): shown as N/A")
        out.update(memory_total_bytes=total, memory_used_bytes=used, memory_reserved_bytes=reserved)
        return out

    def _processes(self, gpu: _Gpu) -> dict[str, Any]:
        """process_count, process_memory_used_bytes and processes (``[{"pid", "memory_used_bytes"}]``) of
        the valid entries of nvmlDeviceGetComputeRunningProcesses (see gpuctl.backends.nvml_processes:
        entries that are not processes are dropped, never counted or summed, and each adds a quality
        event), or processes_error saying why the list is unknown."""
        procs = self._query(gpu, "nvmlDeviceGetComputeRunningProcesses", gpu.handle)
        if isinstance(procs, Unavailable):
            if procs.code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                why = PROCESSES_DRIVER_TOO_OLD
            else:
                why = f"process list unavailable ({procs.reason})"
            return {"process_count": None, "processes_error": why}
        valid = validate_processes(procs, gpu.identity.memory_total_bytes)
        if valid.dropped:
            self._log_once(gpu, "range:processes", logging.WARNING,
                           f"nvmlDeviceGetComputeRunningProcesses listed {valid.dropped} entries that are not "
                           f"processes (pid 0 or 0xFFFFFFFF, impossible memory): dropped")
        return {"process_count": valid.count, "process_memory_used_bytes": valid.memory_used_bytes,
                "processes_error": None, "quality_events": valid.dropped,
                "processes": [{"pid": p.pid, "memory_used_bytes": p.used_memory_bytes} for p in valid.processes]}

    # ---- shutdown ------------------------------------------------------------------------

    def close(self) -> None:
        """nvmlShutdown, once; later calls do nothing. A failing shutdown is logged, not raised."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for gpu in self._gpus:
                gpu.handle = None
            self._shutdown()

    def _shutdown(self) -> None:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as err:
            log.warning("nvmlShutdown failed: %s", _describe(err))
