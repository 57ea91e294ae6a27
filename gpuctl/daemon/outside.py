"""Which GPU processes belong to a lease, and which run "outside gpuctl".

A GPU's process list (GpuSample.processes, from nvmlDeviceGetComputeRunningProcesses) is split
by pid: a process is a lease's when its pid is one the lease runs (a remote lease's data-path
worker, a native lease's recorded pids: LeaseManager.lease_pids) or a descendant of one (read
from /proc at the time of the split); every other one is an outside process, shown with its
user (owner of /proc/PID) and its GPU memory.

Caveat: NVML reports pids as the host sees them. A gpuctld inside a container with its own pid
namespace sees other pids; a process it cannot find in /proc is shown as outside with user None.
"""

from __future__ import annotations

import pwd
from typing import Any

from gpuctl.daemon.native import children_map, proc_uid, with_descendants


def user_of(pid: int) -> str | None:
    """Login name of the owner of process `pid` (the uid as text when it has no name), None when
    no such process is visible here."""
    uid = proc_uid(pid)
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def owner_map(lease_pids: dict[str, list[int]], children: dict[int, list[int]] | None = None) -> dict[int, str]:
    """pid -> lease id for every pid a lease runs and their descendants now."""
    out: dict[int, str] = {}
    if not lease_pids:
        return out
    children = children_map() if children is None else children
    for lease_id, pids in lease_pids.items():
        for pid in with_descendants(list(pids), children):
            out.setdefault(pid, lease_id)
    return out


def split_processes(processes: list[dict[str, Any]] | None,
                    owners: dict[int, str]) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None]:
    """(lease processes, outside processes) of one GPU; (None, None) when `processes` is None.

    processes: ``[{"pid", "memory_used_bytes"}]`` (validated by the backend). owners: from
    :func:`owner_map`. Lease entries: ``{"pid", "lease_id", "memory_used_bytes"}``; outside
    entries: ``{"pid", "user", "memory_used_bytes"}``.
    """
    if processes is None:
        return None, None
    mine, outside = [], []
    for p in processes:
        pid = p.get("pid")
        if not isinstance(pid, int):
            continue
        if pid in owners:
            mine.append({"pid": pid, "lease_id": owners[pid], "memory_used_bytes": p.get("memory_used_bytes")})
        else:
            outside.append({"pid": pid, "user": user_of(pid), "memory_used_bytes": p.get("memory_used_bytes")})
    return mine, outside
