"""NVML process lists with entries that are not processes (issue 9 item 22).

pid 0 and pid 0xFFFFFFFF entries, and entries with impossible memory figures, are dropped: never
counted in process_count, never summed in process_memory_used_bytes; each is a quality event.
A real pid whose memory NVML does not give (None / 2**64-1) is still a process: counted, and its
unknown memory makes the sum unknown (None), never a partial sum.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from gpuctl.backends.nvml import NvmlBackend
from gpuctl.backends.nvml_processes import GpuProcess, validate_processes

try:
    from fake_nvml import FakeNvml
except ImportError:  # tests/ imported as a package
    from tests.fake_nvml import FakeNvml

MIB = 2**20
U64_NA = 2**64 - 1
U32_NA = 2**32 - 1


def backend_with(monkeypatch: pytest.MonkeyPatch, procs: list[dict]) -> NvmlBackend:
    FakeNvml({"gpu_count": 1, "gpu": {"0": {"compute_running_processes": procs}}}).install(monkeypatch)
    return NvmlBackend()


def test_pid_zero_and_pid_not_available_are_not_counted(monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="gpuctl.backends.nvml")
    backend = backend_with(monkeypatch, [
        {"pid": 4242, "usedGpuMemory": 512 * MIB},
        {"pid": 0, "usedGpuMemory": 0},
        {"pid": U32_NA, "usedGpuMemory": 100 * MIB},
        {"pid": 2**32, "usedGpuMemory": 100 * MIB},
        {"pid": 777, "usedGpuMemory": 256 * MIB},
    ])
    for _ in range(2):
        s = backend.sample()[0]
        assert s.process_count == 2
        assert s.process_memory_used_bytes == 768 * MIB
        assert s.quality_events == 3
        assert s.processes_error is None
    msgs = [r.getMessage() for r in caplog.records if "not processes" in r.getMessage()]
    assert len(msgs) == 1 and "3 entries" in msgs[0]


def test_only_garbage_entries_count_zero_processes(monkeypatch):
    backend = backend_with(monkeypatch, [{"pid": 0, "usedGpuMemory": U64_NA}, {"pid": U32_NA, "usedGpuMemory": None}])
    s = backend.sample()[0]
    assert (s.process_count, s.process_memory_used_bytes, s.quality_events) == (0, 0, 2)


def test_memory_not_available_counts_the_process_but_never_sums(monkeypatch):
    backend = backend_with(monkeypatch, [
        {"pid": 10, "usedGpuMemory": 300 * MIB},
        {"pid": 11, "usedGpuMemory": U64_NA},
        {"pid": 12, "usedGpuMemory": None},
    ])
    s = backend.sample()[0]
    assert s.process_count == 3
    assert s.process_memory_used_bytes is None
    assert s.quality_events == 0


def test_validate_processes_rules():
    entries = [
        SimpleNamespace(pid=1, usedGpuMemory=5),
        SimpleNamespace(pid=1, usedGpuMemory=7),  # same pid twice: counted once
        SimpleNamespace(pid=-3, usedGpuMemory=5),
        SimpleNamespace(pid="12", usedGpuMemory=5),
        SimpleNamespace(pid=True, usedGpuMemory=5),
        SimpleNamespace(pid=9, usedGpuMemory=-1),
        SimpleNamespace(pid=8, usedGpuMemory=2**64),
        SimpleNamespace(pid=7),
        SimpleNamespace(usedGpuMemory=5),
    ]
    got = validate_processes(entries)
    assert got.processes == (GpuProcess(1, 5), GpuProcess(7, None))
    assert got.dropped == 6
    assert got.count == 2 and got.memory_used_bytes is None
    assert validate_processes([]).memory_used_bytes == 0
