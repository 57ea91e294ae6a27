"""A fake NVML for tests: monkeypatches pynvml's functions with answers read from a case dict.

Cases are the JSON files of tests/cases/nvml/ (copies of the project's shared fault cases, so a
clean clone can run them). A case looks like::

    {"gpu_count": 2,
     "init": {"error": "NVML_ERROR_DRIVER_NOT_LOADED"},            # optional
     "handle_by_index": {"2": {"error": "NVML_ERROR_GPU_IS_LOST"}},  # optional
     "gpu": {"0": {"name": "NVIDIA L4", "uuid": "GPU-...", "name_bytes_hex": "f88fa1",
                   "memory": {"total", "free", "used"},          # served as v1 and v2 (reserved 0)
                   "memory_v1": {...}, "memory_v2": {..., "reserved"},
                   "utilization": {"gpu", "memory"}, "utilization_series": [37, 4294967295],
                   "temperature": 51, "power_usage": 16000 (mW), "sm_clock": 1410 (MHz),
                   "mig_mode": [0, 0], "pci_bus_id": "...", "fan_speed": 30,
                   "compute_running_processes": [{"pid": 1, "usedGpuMemory": null}],
                   "attributes": {"multiprocessorCount": 132, ...}, "max_mig_device_count": 7,
                   "mig_devices": [{"uuid": "MIG-...", "gpu_instance_id": 1, "compute_instance_id": 0,
                                    "memory": {...}, "attributes": {...}}, null, ...]}}}

``mig_devices`` lists the MIG devices of a GPU by MIG index (null: an empty slot, NOT_FOUND);
their handles are ``FakeHandle(index, mig=k)``, and any key a MIG device leaves out falls back to
:data:`MIG_DEFAULT` (utilization, temperature, power and clocks NotSupported, as on real MIG
devices), not to the parent's values.

Any value may instead be ``{"error": "NVML_ERROR_..."}``: the call raises
``pynvml.NVMLError(code)``, which pynvml turns into the matching subclass. Structs are
``types.SimpleNamespace`` so None, 2**64-1 and 0xFFFFFFFF go through untouched. Every call is
recorded in :attr:`FakeNvml.calls` as (function, GPU index or None, kwargs).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

CASES_DIR = Path(__file__).resolve().parents[1] / "cases" / "nvml"

GIB = 2**30

DEFAULT_GPU: dict[str, Any] = {
    "memory_v1": {"total": 16 * GIB, "free": 15 * GIB - 256 * 2**20, "used": GIB + 256 * 2**20},
    "memory_v2": {"total": 16 * GIB, "reserved": 256 * 2**20, "free": 15 * GIB - 256 * 2**20, "used": GIB},
    "utilization": {"gpu": 10, "memory": 5},
    "temperature": 40,
    "power_usage": 100_000,
    "sm_clock": 1410,
    "mig_mode": [0, 0],
    "compute_running_processes": [],
    "fan_speed": {"error": "NVML_ERROR_NOT_SUPPORTED"},
}


MIG_DEFAULT: dict[str, Any] = {
    "utilization": {"error": "NVML_ERROR_NOT_SUPPORTED"},
    "temperature": {"error": "NVML_ERROR_NOT_SUPPORTED"},
    "power_usage": {"error": "NVML_ERROR_NOT_SUPPORTED"},
    "sm_clock": {"error": "NVML_ERROR_NOT_SUPPORTED"},
    "mig_mode": {"error": "NVML_ERROR_NOT_SUPPORTED"},
    "compute_running_processes": [],
    "fan_speed": {"error": "NVML_ERROR_NOT_SUPPORTED"},
    "attributes": {"multiprocessorCount": 16, "gpuInstanceSliceCount": 1, "computeInstanceSliceCount": 1,
                   "memorySizeMB": 16384},
}


def load_case(filename: str) -> dict[str, Any]:
    """The case `filename` of tests/cases/nvml/ as a dict (a fresh copy each time)."""
    return json.loads((CASES_DIR / filename).read_text(encoding="utf-8"))


@dataclass(frozen=True)
class FakeHandle:
    """What the fake nvmlDeviceGetHandleByIndex returns: just the index (and, for a MIG device
    handle from nvmlDeviceGetMigDeviceHandleByIndex, its MIG index)."""

    index: int
    mig: int | None = None


def _raise_if_error(spec: Any) -> Any:
    if isinstance(spec, dict) and "error" in spec:
        raise pynvml.NVMLError(getattr(pynvml, spec["error"]))
    return spec


class FakeNvml:
    """A scripted NVML. Build from a case dict, then :meth:`install` with pytest's monkeypatch."""

    def __init__(self, case: dict[str, Any] | None = None):
        self.case = copy.deepcopy(case) if case is not None else {"gpu_count": 1}
        self.case.setdefault("gpu", {})
        self.calls: list[tuple[str, int | None, dict[str, Any]]] = []
        self.lost: dict[int, int] = {}  # GPU index -> NVML error raised by every call on its handle
        self.broken: dict[tuple[int, str], BaseException] = {}  # (index, function) -> raised as is
        self.series_pos: dict[int, int] = {}
        self.shutdowns = 0

    # ---- scripting ----

    def gpu(self, index: int) -> dict[str, Any]:
        """The (mutable) spec of GPU `index`; unset keys fall back to :data:`DEFAULT_GPU`."""
        return self.case["gpu"].setdefault(str(index), {})

    def lose(self, index: int, code: int = pynvml.NVML_ERROR_GPU_IS_LOST) -> None:
        """From now on every call on GPU `index`'s handle raises NVMLError(code)."""
        self.lost[index] = code

    def calls_of(self, function: str, index: int | None = None) -> int:
        """How many times `function` was called (on GPU `index`, when given)."""
        return sum(1 for f, i, _ in self.calls if f == function and (index is None or i == index))

    def calls_on(self, index: int) -> int:
        """How many calls were made on GPU `index` (its handle or its HandleByIndex)."""
        return sum(1 for _, i, _ in self.calls if i == index)

    # ---- answers ----

    def _device(self, function: str, handle: FakeHandle, **kwargs: Any) -> dict[str, Any]:
        assert isinstance(handle, FakeHandle), f"{function} called with {handle!r}"
        self.calls.append((function, handle.index, kwargs))
        if handle.index in self.lost:
            raise pynvml.NVMLError(self.lost[handle.index])
        if (handle.index, function) in self.broken:
            raise self.broken[(handle.index, function)]
        if handle.mig is not None:
            return {**MIG_DEFAULT, **self.gpu(handle.index)["mig_devices"][handle.mig]}
        return self.gpu(handle.index)

    def _value(self, spec: dict[str, Any], key: str, default: Any) -> Any:
        return _raise_if_error(copy.deepcopy(spec.get(key, default)))

    def nvmlInit(self) -> None:
        self.calls.append(("nvmlInit", None, {}))
        _raise_if_error(self.case.get("init", {}))

    def nvmlShutdown(self) -> None:
        self.calls.append(("nvmlShutdown", None, {}))
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        self.calls.append(("nvmlDeviceGetCount", None, {}))
        return _raise_if_error(self.case.get("gpu_count", 1))

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self.calls.append(("nvmlDeviceGetHandleByIndex", index, {}))
        _raise_if_error(self.case.get("handle_by_index", {}).get(str(index), {}))
        if index in self.lost:
            raise pynvml.NVMLError(self.lost[index])
        return FakeHandle(index)

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        spec = self._device("nvmlDeviceGetUUID", handle)
        default = f"MIG-{handle.index:08x}-{handle.mig:04x}-fake" if handle.mig is not None else f"GPU-{handle.index:08x}-0000-4000-8000-00000000fake"
        return self._value(spec, "uuid", default)

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str | bytes:
        spec = self._device("nvmlDeviceGetName", handle)
        if "name_bytes_hex" in spec:
            return bytes.fromhex(spec["name_bytes_hex"])
        return self._value(spec, "name", "NVIDIA Fake GPU")

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> SimpleNamespace:
        spec = self._device("nvmlDeviceGetPciInfo", handle)
        return SimpleNamespace(busId=self._value(spec, "pci_bus_id", f"00000000:{0x18 + handle.index:02X}:00.0"))

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: int | None = None) -> SimpleNamespace:
        kwargs = {} if version is None else {"version": version}
        spec = self._device("nvmlDeviceGetMemoryInfo", handle, **kwargs)
        if version is None:
            return SimpleNamespace(**self._value(spec, "memory_v1", spec.get("memory", DEFAULT_GPU["memory_v1"])))
        assert version == pynvml.nvmlMemory_v2, f"unexpected memory struct version {version:#x}"
        if "memory_v2" not in spec and "memory" in spec:
            v2 = dict(_raise_if_error(spec["memory"]), reserved=0)
        else:
            v2 = self._value(spec, "memory_v2", DEFAULT_GPU["memory_v2"])
        return SimpleNamespace(version=version, **v2)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> SimpleNamespace:
        spec = self._device("nvmlDeviceGetUtilizationRates", handle)
        rates = dict(self._value(spec, "utilization", DEFAULT_GPU["utilization"]))
        series = spec.get("utilization_series")
        if series:
            pos = self.series_pos.get(handle.index, 0)
            self.series_pos[handle.index] = pos + 1
            rates["gpu"] = series[min(pos, len(series) - 1)]
        return SimpleNamespace(**rates)

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._value(self._device("nvmlDeviceGetTemperature", handle), "temperature", DEFAULT_GPU["temperature"])

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return self._value(self._device("nvmlDeviceGetPowerUsage", handle), "power_usage", DEFAULT_GPU["power_usage"])

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        return self._value(self._device("nvmlDeviceGetClockInfo", handle), "sm_clock", DEFAULT_GPU["sm_clock"])

    def nvmlDeviceGetMigMode(self, handle: FakeHandle) -> list[int]:
        return self._value(self._device("nvmlDeviceGetMigMode", handle), "mig_mode", DEFAULT_GPU["mig_mode"])

    def nvmlDeviceGetFanSpeed(self, handle: FakeHandle) -> int:
        return self._value(self._device("nvmlDeviceGetFanSpeed", handle), "fan_speed", DEFAULT_GPU["fan_speed"])

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[SimpleNamespace]:
        spec = self._device("nvmlDeviceGetComputeRunningProcesses", handle)
        procs = self._value(spec, "compute_running_processes", DEFAULT_GPU["compute_running_processes"])
        return [SimpleNamespace(**p) for p in procs]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeHandle) -> int:
        spec = self._device("nvmlDeviceGetMaxMigDeviceCount", handle)
        return self._value(spec, "max_mig_device_count", 7 if "mig_devices" in spec else 0)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeHandle, index: int) -> FakeHandle:
        spec = self._device("nvmlDeviceGetMigDeviceHandleByIndex", handle, mig_index=index)
        devices = spec.get("mig_devices", [])
        if handle.mig is not None or index >= len(devices) or devices[index] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        _raise_if_error(devices[index].get("handle", {}))
        return FakeHandle(handle.index, mig=index)

    def _mig_only(self, function: str, handle: FakeHandle, key: str) -> Any:
        spec = self._device(function, handle)
        if handle.mig is None:  # as NVML answers for a handle that is not a MIG device
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._value(spec, key, 0xFFFFFFFF)

    def nvmlDeviceGetGpuInstanceId(self, handle: FakeHandle) -> int:
        return self._mig_only("nvmlDeviceGetGpuInstanceId", handle, "gpu_instance_id")

    def nvmlDeviceGetComputeInstanceId(self, handle: FakeHandle) -> int:
        return self._mig_only("nvmlDeviceGetComputeInstanceId", handle, "compute_instance_id")

    def nvmlDeviceGetAttributes(self, handle: FakeHandle) -> SimpleNamespace:
        spec = self._device("nvmlDeviceGetAttributes", handle)
        return SimpleNamespace(**self._value(spec, "attributes", {"multiprocessorCount": 132}))

    def _pair(self, function: str, a: FakeHandle, b: FakeHandle) -> Any:
        """The case's ``topology`` entry of GPUs (a, b) ("i,j" with i < j); NOT_SUPPORTED when none."""
        assert isinstance(a, FakeHandle) and isinstance(b, FakeHandle), f"{function} called with {a!r}, {b!r}"
        self.calls.append((function, a.index, {"peer": b.index}))
        lo, hi = sorted((a.index, b.index))
        link = self.case.get("topology", {}).get(f"{lo},{hi}")
        if link is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return link

    def nvmlDeviceGetP2PStatus(self, a: FakeHandle, b: FakeHandle, caps_index: int) -> int:
        assert caps_index == pynvml.NVML_P2P_CAPS_INDEX_NVLINK
        link = self._pair("nvmlDeviceGetP2PStatus", a, b)
        return pynvml.NVML_P2P_STATUS_OK if link == "nvlink" else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED

    def nvmlDeviceGetTopologyCommonAncestor(self, a: FakeHandle, b: FakeHandle) -> int:
        """The case's level for the pair (an NVML_TOPOLOGY_* number; "nvlink" pairs answer SINGLE)."""
        link = self._pair("nvmlDeviceGetTopologyCommonAncestor", a, b)
        return pynvml.NVML_TOPOLOGY_SINGLE if link == "nvlink" else int(link)

    FUNCTIONS = (
        "nvmlDeviceGetP2PStatus", "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID",
        "nvmlDeviceGetName", "nvmlDeviceGetPciInfo", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo", "nvmlDeviceGetMigMode",
        "nvmlDeviceGetFanSpeed", "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId",
        "nvmlDeviceGetAttributes",
    )

    def install(self, monkeypatch: Any) -> "FakeNvml":
        """Replace pynvml's functions with this fake's (undone by monkeypatch at test end)."""
        for name in self.FUNCTIONS:
            method: Callable[..., Any] = getattr(self, name)
            monkeypatch.setattr(pynvml, name, method)
        return self
