"""Validation of NVML's per-GPU process lists (nvmlDeviceGetComputeRunningProcesses).

NVML sometimes lists entries that are not processes: pid 0, pid 0xFFFFFFFF (NVML's "not available"
for an unsigned int), or garbage when the binding's struct version does not match the driver's
(nvidia-ml-py v3 structs read from an older driver). Such entries are dropped here and never
counted or summed; each one is a data-quality event.

Rules (one copy, used by the NVML backend for ``process_count`` and the process memory sum):

- pid must be an int with 0 < pid < 2**32-1; otherwise the entry is dropped.
- usedGpuMemory (bytes) is kept when it is an int with 0 <= value < 2**64-1. ``None`` (what pynvml
  makes of NVML_VALUE_NOT_AVAILABLE) and 2**64-1 mean "not available": the process is real (NVML
  reports it so under WDDM, in containers and for other users' processes in MIG mode) and is
  counted, but its memory is unknown, so the memory sum becomes None rather than a made-up figure.
  Any other value (negative, not an int) marks the whole entry as garbage: dropped.
- the same pid listed twice is counted once (its first valid entry is kept).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: NVML's "value not available" for unsigned int (pid) and unsigned long long (memory) fields.
PID_NOT_AVAILABLE = 0xFFFFFFFF
MEMORY_NOT_AVAILABLE = 2**64 - 1


@dataclass(frozen=True)
class GpuProcess:
    """One valid compute process on a GPU. pid: OS process id. used_memory_bytes: GPU memory it
    uses (bytes, NVML usedGpuMemory), None when NVML does not say."""

    pid: int
    used_memory_bytes: int | None


@dataclass(frozen=True)
class ProcessList:
    """The valid part of one NVML process list.

    processes: the valid entries, in NVML's order, one per pid. dropped: how many entries were
    not processes (each one a quality event). memory_used_bytes: the sum of the processes'
    used memory (bytes); None when any of them has unknown memory (never a partial sum).
    """

    processes: tuple[GpuProcess, ...]
    dropped: int

    @property
    def count(self) -> int:
        """How many valid processes."""
        return len(self.processes)

    @property
    def memory_used_bytes(self) -> int | None:
        """Sum of the valid processes' used memory in bytes, None if any is unknown (0 when none run)."""
        if any(p.used_memory_bytes is None for p in self.processes):
            return None
        return sum(p.used_memory_bytes or 0 for p in self.processes)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_processes(entries: Iterable[Any], memory_total_bytes: int | None = None) -> ProcessList:
    """The valid processes of NVML's process list `entries` (structs with ``pid`` and
    ``usedGpuMemory`` attributes, as pynvml returns them; SimpleNamespace in tests). A process
    whose usedGpuMemory is more than the GPU's `memory_total_bytes` (when known) is kept with its
    memory N/A (None): the pid is real, the figure is not.

    Never raises for a bad entry: it is dropped and counted in :attr:`ProcessList.dropped`.
    """
    kept: list[GpuProcess] = []
    seen: set[int] = set()
    dropped = 0
    for entry in entries:
        pid = getattr(entry, "pid", None)
        memory = getattr(entry, "usedGpuMemory", None)
        if not _is_int(pid) or not 0 < pid < PID_NOT_AVAILABLE:
            dropped += 1
            continue
        if memory is None or memory == MEMORY_NOT_AVAILABLE:
            memory = None
        elif not _is_int(memory) or not 0 <= memory < MEMORY_NOT_AVAILABLE:
            dropped += 1
            continue
        if memory is not None and memory_total_bytes and memory > memory_total_bytes:
            memory = None
        if pid in seen:
            continue
        seen.add(pid)
        kept.append(GpuProcess(pid=pid, used_memory_bytes=memory))
    return ProcessList(processes=tuple(kept), dropped=dropped)
