"""NvmlBackend against a fake NVML: one or more tests per fault case nvml-01..nvml-08.

The cases are read from tests/cases/nvml/ (copies of the shared cases, so a clean clone runs them).
"""

from __future__ import annotations

import json
import logging
import statistics

import pynvml
import pytest

from gpuctl.backends.base import BackendError
from gpuctl.backends.nvml import LOST_ERROR, PROCESSES_DRIVER_TOO_OLD, NvmlBackend
from gpuctl.model import GpuSample

try:
    from fake_nvml import FakeNvml, load_case
except ImportError:  # tests/ imported as a package
    from tests.support.fake_nvml import FakeNvml, load_case

LOGGER = "gpuctl.backends.nvml"
FIGURES = (
    "sm_util_pct", "memory_util_pct", "memory_used_bytes", "memory_reserved_bytes", "memory_total_bytes",
    "temperature_c", "power_w", "sm_clock_mhz", "process_count", "processes_error",
)


def make(monkeypatch: pytest.MonkeyPatch, case: dict | None = None) -> tuple[FakeNvml, NvmlBackend]:
    fake = FakeNvml(case).install(monkeypatch)
    return fake, NvmlBackend()


def records_about(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and text in r.getMessage()]


# ---- nvml-01: one field unsupported ---------------------------------------------------------


def test_nvml01_power_not_supported_is_none_and_rest_of_sample_kept(monkeypatch):
    _, backend = make(monkeypatch, load_case("not-supported-power-fan.json"))
    s0, s1 = backend.sample()
    assert s0.uuid == "GPU-11111111-2222-3333-4444-555555555555"
    assert s0.power_w is None
    assert s0.sm_util_pct == 37 and s0.memory_util_pct == 12
    assert s0.memory_total_bytes == 24146608128 and s0.memory_used_bytes == 1146608128
    assert s0.memory_reserved_bytes == 0
    assert s0.temperature_c == 51 and s0.sm_clock_mhz == 1410
    assert s0.process_count == 0 and s0.processes_error is None
    assert s0.error is None and s0.quality_events == 0
    assert s1.power_w == 16.0  # 16000 mW
    assert s1.temperature_c == 33
    as_json = json.loads(json.dumps(s0.to_json()))
    assert as_json["power_w"] is None and as_json["temperature_c"] == 51


def test_nvml01_not_supported_logged_once_over_three_polls(monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    fake, backend = make(monkeypatch, load_case("not-supported-power-fan.json"))
    for _ in range(3):
        samples = backend.sample()
        assert samples[0].power_w is None and samples[1].power_w == 16.0
    recs = records_about(caplog, "nvmlDeviceGetPowerUsage")
    assert len(recs) == 1
    assert "GPU 0 (GPU-11111111-2222-3333-4444-555555555555)" in recs[0].getMessage()
    assert "NVML_ERROR_NOT_SUPPORTED" in recs[0].getMessage()
    assert fake.calls_of("nvmlDeviceGetPowerUsage", 0) == 3  # still asked each poll, logged once


def test_other_nvml_error_on_one_field_is_none_and_logged_as_warning(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    fake = FakeNvml({"gpu_count": 1, "gpu": {"0": {"temperature": {"error": "NVML_ERROR_TIMEOUT"}}}})
    fake.install(monkeypatch)
    backend = NvmlBackend()
    s = backend.sample()[0]
    backend.sample()
    assert s.temperature_c is None and s.power_w == 100.0 and s.error is None
    (rec,) = records_about(caplog, "nvmlDeviceGetTemperature")
    assert rec.levelno == logging.WARNING and "NVML_ERROR_TIMEOUT" in rec.getMessage()


# ---- nvml-02: old driver lacks a function ---------------------------------------------------


def test_nvml02_function_not_found_processes(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    fake, backend = make(monkeypatch, load_case("function-not-found-procs.json"))
    samples = [backend.sample()[0] for _ in range(3)]
    for s in samples:
        assert s.processes_error == "process list unavailable (driver too old)" == PROCESSES_DRIVER_TOO_OLD
        assert s.process_count is None
        assert s.sm_util_pct == 88 and s.memory_util_pct == 40
        assert s.memory_used_bytes == 8179869184 and s.memory_total_bytes == 17179869184
        assert s.error is None
    # remembered once: never called again
    assert fake.calls_of("nvmlDeviceGetComputeRunningProcesses") == 1
    assert len(records_about(caplog, "nvmlDeviceGetComputeRunningProcesses is not in this NVIDIA driver")) == 1
    assert backend.gpus()[0].name == "Tesla V100-SXM2-16GB"


def test_processes_no_permission_says_why_and_is_asked_again(monkeypatch):
    fake = FakeNvml({"gpu_count": 1, "gpu": {"0": {"compute_running_processes": {"error": "NVML_ERROR_NO_PERMISSION"}}}})
    fake.install(monkeypatch)
    backend = NvmlBackend()
    s = backend.sample()[0]
    backend.sample()
    assert s.process_count is None
    assert s.processes_error == "process list unavailable (Insufficient Permissions (NVML_ERROR_NO_PERMISSION))"
    assert fake.calls_of("nvmlDeviceGetComputeRunningProcesses") == 2


# ---- nvml-03: GPU fallen off the bus --------------------------------------------------------


@pytest.mark.parametrize("error", ["NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_UNKNOWN"])
def test_nvml03_handle_lost_at_start_is_listed_with_error(monkeypatch, caplog, error):
    case = load_case("gpu-lost.json")
    case["handle_by_index"]["2"]["error"] = error
    fake, backend = make(monkeypatch, case)
    gpus = backend.gpus()
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert gpus[2].uuid == "lost-index-2" and gpus[2].name == "unknown"
    assert gpus[0].uuid.startswith("GPU-") and gpus[0].memory_total_bytes == 16 * 2**30
    calls_before = fake.calls_on(2)
    for _ in range(3):
        samples = backend.sample()
        lost = samples[2]
        assert lost.uuid == "lost-index-2" and lost.error == "lost: node needs reboot" == LOST_ERROR
        assert all(getattr(lost, f) is None for f in FIGURES)
        for s in (samples[0], samples[1], samples[3]):
            assert s.error is None and s.sm_util_pct == 10 and s.power_w == 100.0
    assert fake.calls_on(2) == calls_before == 1  # just the failed HandleByIndex
    assert len(records_about(caplog, "nvmlDeviceGetHandleByIndex(2)")) == 1


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_UNKNOWN])
def test_nvml03_gpu_lost_while_running_is_never_called_again(monkeypatch, code):
    fake, backend = make(monkeypatch, {"gpu_count": 4})
    uuid1 = backend.gpus()[1].uuid
    assert all(s.error is None for s in backend.sample())
    fake.lose(1, code)
    before = fake.calls_on(1)
    samples = backend.sample()
    assert samples[1].uuid == uuid1 and samples[1].error == LOST_ERROR
    assert all(getattr(samples[1], f) is None for f in FIGURES)
    assert fake.calls_on(1) == before + 1  # the one call that found it lost
    for _ in range(2):
        samples = backend.sample()
        assert samples[1].error == LOST_ERROR
        assert [s.error for s in samples] == [None, LOST_ERROR, None, None]
        assert samples[3].temperature_c == 40
    assert fake.calls_on(1) == before + 1
    assert backend.gpus()[1].uuid == uuid1  # identity unchanged


def test_handle_error_other_than_lost_lists_gpu_unavailable(monkeypatch):
    fake, backend = make(
        monkeypatch, {"gpu_count": 3, "handle_by_index": {"1": {"error": "NVML_ERROR_NO_PERMISSION"}}}
    )
    gpus = backend.gpus()
    assert gpus[1].uuid == "unavailable-index-1"
    s = backend.sample()
    assert s[1].error == (
        "unavailable: nvmlDeviceGetHandleByIndex(1) failed: Insufficient Permissions (NVML_ERROR_NO_PERMISSION)"
    )
    assert s[0].error is None and s[2].error is None and s[2].sm_clock_mhz == 1410


def test_gpu_lost_while_reading_identity(monkeypatch):
    fake, backend = make(monkeypatch, {"gpu_count": 2, "gpu": {"0": {"name": {"error": "NVML_ERROR_GPU_IS_LOST"}}}})
    gpus = backend.gpus()
    assert gpus[0].uuid == "GPU-00000000-0000-4000-8000-00000000fake"  # UUID was read before the loss
    assert gpus[1].name == "NVIDIA Fake GPU"
    before = fake.calls_on(0)
    samples = backend.sample()
    assert samples[0].error == LOST_ERROR and samples[1].error is None
    assert fake.calls_on(0) == before


def test_unexpected_exception_on_one_gpu_keeps_the_others(monkeypatch, caplog):
    fake, backend = make(monkeypatch, {"gpu_count": 2})
    fake.broken[(0, "nvmlDeviceGetPowerUsage")] = RuntimeError("ctypes exploded")
    samples = backend.sample()
    assert samples[0].error == "sample failed: RuntimeError: ctypes exploded"
    assert samples[0].power_w is None
    assert samples[1].error is None and samples[1].power_w == 100.0
    del fake.broken[(0, "nvmlDeviceGetPowerUsage")]
    assert backend.sample()[0].error is None  # not marked lost: the next poll is normal


# ---- nvml-04: names not valid UTF-8, or bytes ------------------------------------------------


def test_nvml04_bytes_and_invalid_utf8_names_decoded(monkeypatch):
    _, backend = make(monkeypatch, load_case("bad-names.json"))
    gpus = backend.gpus()
    assert gpus[0].name == "\ufffd\ufffd\ufffd"
    assert gpus[1].name == "NVIDIA L4"
    assert all(type(g.name) is str for g in gpus)
    text = json.dumps([g.to_json() for g in gpus])
    assert json.loads(text)[1]["name"] == "NVIDIA L4"
    assert all(s.error is None for s in backend.sample())


def test_bytes_uuid_and_bus_id_and_decoding_bindings(monkeypatch):
    fake = FakeNvml({"gpu_count": 2})
    fake.install(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", lambda h: f"GPU-{h.index}".encode())
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPciInfo", lambda h: type("P", (), {"busId": b"00000000:18:00.0"})())

    def decoding_name(handle):  # bindings that call .decode() themselves on invalid bytes
        raise UnicodeDecodeError("utf-8", b"H200\xff", 4, 5, "invalid start byte")

    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", decoding_name)
    gpus = NvmlBackend().gpus()
    assert gpus[1].uuid == "GPU-1" and gpus[1].pci_bus_id == "00000000:18:00.0"
    assert gpus[0].name == "H200\ufffd"


# ---- nvml-05: memory v1 vs v2 ----------------------------------------------------------------


def test_nvml05_v2_preferred_reserved_shown(monkeypatch):
    fake, backend = make(monkeypatch, load_case("memory-v1-v2.json"))
    s = backend.sample()[0]
    assert s.memory_used_bytes == 0
    assert s.memory_reserved_bytes == 322961408
    assert s.memory_total_bytes == 17179869184
    assert s.quality_events == 0
    versions = [kw.get("version") for f, _, kw in fake.calls if f == "nvmlDeviceGetMemoryInfo"]
    assert set(versions) == {pynvml.nvmlMemory_v2}  # v1 never needed


@pytest.mark.parametrize(
    "error,v2_calls_after_three_polls",
    [("NVML_ERROR_FUNCTION_NOT_FOUND", 1), ("NVML_ERROR_NOT_SUPPORTED", 1), ("NVML_ERROR_TIMEOUT", 4)],
)
def test_nvml05_v1_fallback(monkeypatch, error, v2_calls_after_three_polls):
    case = load_case("memory-v1-v2.json")
    case["gpu"]["0"]["memory_v2"] = {"error": error}
    fake, backend = make(monkeypatch, case)  # the constructor reads memory once (total)
    assert backend.gpus()[0].memory_total_bytes == 17179869184
    for _ in range(3):
        s = backend.sample()[0]
        assert s.memory_used_bytes == 322961408 and s.memory_reserved_bytes is None
        assert s.memory_total_bytes == 17179869184 and s.error is None
    v2 = [kw for f, _, kw in fake.calls if f == "nvmlDeviceGetMemoryInfo" and kw.get("version")]
    assert len(v2) == v2_calls_after_three_polls


# ---- nvml-06: impossible memory --------------------------------------------------------------


def test_nvml06_used_above_total_is_none_and_counted(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    _, backend = make(monkeypatch, load_case("impossible-memory.json"))
    for _ in range(2):
        s = backend.sample()[0]
        assert s.memory_used_bytes is None
        assert s.memory_total_bytes == 24146608128
        assert s.quality_events == 1
        assert s.process_count == 1 and s.error is None
        assert s.sm_util_pct == 10
    (rec,) = records_about(caplog, "impossible figures")
    assert "used 18446744073707737660 of total 24146608128" in rec.getMessage()


@pytest.mark.parametrize(
    "memory,expected,events",
    [
        ({"total": 0, "free": 0, "used": 0, "reserved": 0}, (None, None, None), 1),
        ({"total": 2**64 - 1, "free": 0, "used": 5, "reserved": 0}, (None, None, None), 1),
        ({"total": 1000, "free": 0, "used": 2**64 - 1, "reserved": 2**64 - 1}, (1000, None, None), 2),
        ({"total": 1000, "free": 0, "used": 600, "reserved": 500}, (1000, None, None), 1),
        ({"total": 1000, "free": 0, "used": None, "reserved": 10}, (1000, None, 10), 0),
    ],
)
def test_nvml06_impossible_memory_variants(monkeypatch, memory, expected, events):
    fake, backend = make(monkeypatch, {"gpu_count": 1, "gpu": {"0": {"memory_v2": memory}}})
    s = backend.sample()[0]
    assert (s.memory_total_bytes, s.memory_used_bytes, s.memory_reserved_bytes) == expected
    assert s.quality_events == events
    assert backend.gpus()[0].memory_total_bytes == expected[0]


# ---- nvml-07: utilization spikes -------------------------------------------------------------


def test_nvml07_utilization_spikes_none_and_counted(monkeypatch):
    _, backend = make(monkeypatch, load_case("util-spikes.json"))
    samples = [backend.sample()[0] for _ in range(5)]
    assert [s.sm_util_pct for s in samples] == [37, None, None, None, 41]
    assert [s.quality_events for s in samples] == [0, 1, 1, 1, 0]
    assert statistics.mean(s.sm_util_pct for s in samples if s.sm_util_pct is not None) == 39
    assert all(s.memory_util_pct == 5 for s in samples)


@pytest.mark.parametrize(
    "spec,field",
    [
        ({"utilization": {"gpu": 10, "memory": 0xFFFFFFFF}}, "memory_util_pct"),
        ({"temperature": 0xFFFFFFFF}, "temperature_c"),
        ({"power_usage": 0xFFFFFFFF}, "power_w"),
        ({"sm_clock": 0xFFFFFFFF}, "sm_clock_mhz"),
    ],
)
def test_out_of_range_readings_are_none_and_counted(monkeypatch, spec, field):
    _, backend = make(monkeypatch, {"gpu_count": 1, "gpu": {"0": spec}})
    s = backend.sample()[0]
    assert getattr(s, field) is None
    assert s.quality_events == 1
    assert s.sm_util_pct == 10 and s.memory_used_bytes == 2**30


# ---- nvml-08: NVML cannot start --------------------------------------------------------------


@pytest.mark.parametrize("variant", load_case("init-failures.json")["variants"])
def test_nvml08_init_failures_name_the_fix(monkeypatch, variant):
    fake = FakeNvml({"init": variant["init"]}).install(monkeypatch)
    with pytest.raises(BackendError) as info:
        NvmlBackend()
    err = info.value
    expected_code = {
        "NVML_ERROR_LIBRARY_NOT_FOUND": "nvml_library_not_found",
        "NVML_ERROR_DRIVER_NOT_LOADED": "nvml_driver_not_loaded",
        "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "nvml_driver_mismatch",
    }[variant["init"]["error"]]
    assert err.code == expected_code
    assert err.fix == variant["fix"]
    assert str(err).startswith("NVML could not start: nvmlInit failed: ")
    assert variant["init"]["error"] in str(err) and variant["fix"] in str(err)
    assert [c[0] for c in fake.calls] == ["nvmlInit"]  # nothing else touched, no shutdown


def test_nvml08_other_init_error_is_init_failed(monkeypatch):
    FakeNvml({"init": {"error": "NVML_ERROR_NO_PERMISSION"}}).install(monkeypatch)
    with pytest.raises(BackendError) as info:
        NvmlBackend()
    assert info.value.code == "nvml_init_failed"
    assert str(info.value).startswith(
        "NVML could not start: nvmlInit failed: Insufficient Permissions (NVML_ERROR_NO_PERMISSION)"
    )


def test_device_count_failure_shuts_nvml_down(monkeypatch):
    fake = FakeNvml({"gpu_count": {"error": "NVML_ERROR_UNKNOWN"}}).install(monkeypatch)
    with pytest.raises(BackendError) as info:
        NvmlBackend()
    assert info.value.code == "nvml_init_failed"
    assert "nvmlDeviceGetCount failed: Unknown Error (NVML_ERROR_UNKNOWN)" in str(info.value)
    assert fake.shutdowns == 1


# ---- identity, units, close ------------------------------------------------------------------


def test_identity_and_unit_conversion(monkeypatch):
    fake, backend = make(
        monkeypatch,
        {"gpu_count": 2, "gpu": {"0": {"name": "NVIDIA H200", "power_usage": 112988, "mig_mode": [1, 1],
                                       "pci_bus_id": "00000000:00:06.0",
                                       "compute_running_processes": [{"pid": 1, "usedGpuMemory": 5}, {"pid": 2}]},
                                 "1": {"mig_mode": {"error": "NVML_ERROR_NOT_SUPPORTED"}}}},
    )
    assert backend.name == "nvml"
    g0, g1 = backend.gpus()
    assert (g0.index, g0.name, g0.pci_bus_id, g0.mig_enabled) == (0, "NVIDIA H200", "00000000:00:06.0", True)
    assert g1.mig_enabled is None and g1.pci_bus_id == "00000000:19:00.0"
    s = backend.sample()[0]
    assert s.power_w == pytest.approx(112.988)
    assert s.process_count == 2
    assert s.memory_used_bytes == 2**30 and s.memory_reserved_bytes == 256 * 2**20
    assert isinstance(s, GpuSample) and s.timestamp_s > 0


def test_close_shuts_down_once_and_sample_after_close_raises(monkeypatch):
    fake, backend = make(monkeypatch, {"gpu_count": 1})
    backend.close()
    backend.close()
    assert fake.shutdowns == 1
    calls = len(fake.calls)
    with pytest.raises(BackendError, match=r"NVML backend is closed: sample\(\) after close\(\)") as info:
        backend.sample()
    assert info.value.code == "nvml_closed"
    assert len(fake.calls) == calls
    assert backend.gpus()[0].index == 0  # identities still readable
