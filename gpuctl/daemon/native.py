"""Native attach on the daemon's side: the environment a native lease's program gets, and the
processes a native lease records (so telemetry attributes GPU use to it, and so a revoke or an
expiry ends them).

A native lease (``POST /v1/leases`` with ``"attach": "native"``) has no data-path worker: the
client (``gpuctl run --native``) runs its program on the node itself with :func:`native_env`
in its environment, then records the program's pid with ``POST /v1/leases/{id}/processes``. The
lease's :class:`NativeHandle` stands where a worker handle stands for a remote lease: when the
lease ends for any reason but a release by its client (revoked, expired, daemon stopped), its
processes and their descendants get SIGTERM, then SIGKILL after ``grace_s``.

A pid is recorded only when it is a live process of the caller's own uid (the API peer's uid,
from SO_PEERCRED; over SSH the bridge runs as the SSH user) and is remembered with its start
time (field 22 of /proc/PID/stat), so a pid reused by another program is never signalled.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("gpuctld.native")

#: Most pids one native lease may record.
MAX_LEASE_PIDS = 64
#: Seconds between SIGTERM and SIGKILL when a native lease's processes are ended.
DEFAULT_GRACE_S = 5.0


class ProcessRefused(Exception):
    """A pid cannot be recorded for a lease: `message`, `field` ("pids[i]") and HTTP `status`."""

    def __init__(self, message: str, field: str, status: int = 400):
        super().__init__(message)
        self.message, self.field, self.status = message, field, status


def native_env(*, device_uuid: str, quota_bytes: int, compute_share: float, fractional: bool,
               pipe_dir: str | None, log_dir: str | None) -> dict[str, str]:
    """The variables a native program of a lease gets.

    device_uuid: the GPU UUID (``GPU-...``) or, for a MIG slice, the MIG device UUID (``MIG-...``)
    -> CUDA_VISIBLE_DEVICES (never an NVML index: CUDA's device order need not be NVML's), with
    CUDA_DEVICE_ORDER=PCI_BUS_ID. fractional: the lease holds less than the whole GPU: the MPS
    limits of :func:`gpuctl.daemon.mps.mps_client_env` are added (memory cap = quota_bytes,
    thread percentage = compute_share x 100) with the MPS pipe/log directories when given.
    Also GPUCTL_MEMORY_QUOTA_BYTES and GPUCTL_COMPUTE_SHARE, for programs that size themselves:
    under MPS, torch.cuda.mem_get_info's free is capped but its total is still the card's.
    """
    from gpuctl.daemon.mps import mps_client_env

    env = {"CUDA_VISIBLE_DEVICES": device_uuid, "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
           "GPUCTL_MEMORY_QUOTA_BYTES": str(int(quota_bytes)), "GPUCTL_COMPUTE_SHARE": f"{compute_share:g}"}
    if fractional:
        env.update(mps_client_env(quota_bytes=quota_bytes, compute_share=compute_share, pipe_dir=pipe_dir,
                                  log_dir=log_dir))
    return env


def proc_start_time(pid: int) -> int | None:
    """Field 22 (starttime, clock ticks after boot) of /proc/PID/stat, None when no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    rest = raw.rsplit(")", 1)[-1].split()  # the command name may hold spaces and parentheses
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def proc_uid(pid: int) -> int | None:
    """The real uid of process `pid` (owner of /proc/PID), None when no such process."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def children_map() -> dict[int, list[int]]:
    """parent pid -> child pids of every process now (from /proc/*/stat field 4)."""
    out: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                rest = f.read().decode(errors="replace").rsplit(")", 1)[-1].split()
            out.setdefault(int(rest[1]), []).append(int(name))
        except (OSError, IndexError, ValueError):
            continue
    return out


def with_descendants(pids: list[int], children: dict[int, list[int]] | None = None) -> list[int]:
    """`pids` and every descendant of them now, each once (parents before children)."""
    children = children_map() if children is None else children
    seen: list[int] = []
    todo = list(pids)
    while todo:
        p = todo.pop(0)
        if p in seen:
            continue
        seen.append(p)
        todo.extend(children.get(p, []))
    return seen


@dataclass
class NativeHandle:
    """Where a remote lease has its worker, a native lease has this: the processes it records.

    processes: pid -> start time (see :func:`proc_start_time`). grace_s: seconds between SIGTERM
    and SIGKILL in :meth:`stop`. ``pid``/``run_dir``/``endpoint`` are None (no worker).
    """

    lease_id: str
    grace_s: float = DEFAULT_GRACE_S
    processes: dict[int, int] = field(default_factory=dict)
    pid: Any = None
    run_dir: Any = None
    endpoint: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    gone: threading.Event = field(default_factory=threading.Event, repr=False)

    def alive(self) -> bool:
        """Always True: a native lease lives by its heartbeats (its client releases it when the
        program ends)."""
        return True

    def extend(self, expires_at_s: float) -> None:
        """Nothing to tell: the lease's processes have no deadline of their own."""

    def register(self, pids: list[Any], caller_uid: int | None) -> list[int]:
        """Record `pids` (live processes of `caller_uid`; any uid when None). Returns every pid
        recorded so far. Raises ProcessRefused naming ``pids[i]``; nothing is recorded then."""
        found: dict[int, int] = {}
        for i, pid in enumerate(pids):
            where = f"pids[{i}]"
            if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
                raise ProcessRefused(f"{where}: must be a process id (an integer > 1), got {pid!r}", where)
            start, uid = proc_start_time(pid), proc_uid(pid)
            if start is None or uid is None:
                raise ProcessRefused(f"{where}: no process {pid} on this node", where, 404)
            if caller_uid is not None and caller_uid != 0 and uid != caller_uid:
                raise ProcessRefused(f"{where}: process {pid} belongs to uid {uid}, not to the caller's uid "
                                     f"{caller_uid}", where, 403)
            found[pid] = start
        with self._lock:
            if len(set(self.processes) | set(found)) > MAX_LEASE_PIDS:
                raise ProcessRefused(f"pids: a lease records at most {MAX_LEASE_PIDS} processes", "pids")
            self.processes.update(found)
            return sorted(self.processes)

    def pids(self) -> list[int]:
        """The recorded pids that still run (same start time as when recorded)."""
        with self._lock:
            items = list(self.processes.items())
        return [p for p, start in items if proc_start_time(p) == start]

    def stop(self, timeout_s: float | None = None, *, wait: bool = False) -> int:
        """End the lease's processes and their descendants: SIGTERM now, SIGKILL after grace_s to
        those still running (on a background thread, unless `wait`: then this returns when all
        are gone, grace_s + a moment at most, e.g. at daemon shutdown). Returns how many
        processes got SIGTERM. :meth:`gone` is set when none is left."""
        targets = self._targets()
        for pid, _ in targets:
            _signal(pid, signal.SIGTERM)
        if not targets:
            self.gone.set()
            return 0
        log.info("lease %s: SIGTERM to %s; SIGKILL after %g s to those left", self.lease_id,
                 ", ".join(str(p) for p, _ in targets), self.grace_s)
        if wait:
            self._kill_left(targets)
        else:
            threading.Thread(target=self._kill_left, args=(targets,), daemon=True,
                             name=f"gpuctld-native-{self.lease_id}").start()
        return len(targets)

    def _targets(self) -> list[tuple[int, int]]:
        roots = self.pids()
        out = []
        for pid in with_descendants(roots):
            start = proc_start_time(pid)
            if start is not None:
                out.append((pid, start))
        return out

    def _kill_left(self, targets: list[tuple[int, int]]) -> None:
        def left() -> list[int]:
            return [pid for pid, start in targets if proc_start_time(pid) == start and not _is_zombie(pid)]

        deadline = time.monotonic() + self.grace_s
        while left() and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in left():
            log.warning("lease %s: process %d still runs %g s after SIGTERM: SIGKILL", self.lease_id, pid,
                        self.grace_s)
            _signal(pid, signal.SIGKILL)
        deadline = time.monotonic() + 2.0
        while left() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.gone.set()


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().decode(errors="replace").rsplit(")", 1)[-1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError) as e:
        log.info("signal %d to process %d: %s", sig, pid, e)
