"""gpuctld's MPS manager: one CUDA MPS control daemon per GPU that holds fractional leases.

A fractional lease (its slices add up to less than the whole GPU) is capped with CUDA MPS: its
processes connect to a control daemon started by gpuctld for that GPU, with private pipe and
log directories (``<root>/<16 hex digits of the GPU UUID>/pipe`` and ``.../log``), and
get a hard memory cap (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) and a share of the SMs
(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) in their environment (:func:`mps_client_env`). Whole-GPU
leases never use MPS.

Modes (``gpuctld --mps``): ``off`` never starts a daemon; ``auto`` starts one when the first
fractional lease of a GPU is granted and, when it cannot start, grants the lease time-sliced
(no caps from MPS) with the reason as a warning; ``required`` refuses the fractional lease with
the reason instead. A daemon is stopped (``echo quit | nvidia-cuda-mps-control``) when its GPU has
no fractional lease left and when gpuctld stops.

One user at a time: an MPS server serves one Linux uid; a client of another uid waits until the
server exits (it hangs, it is not refused). So each GPU's daemon here is held for one uid (the
uid of its first fractional lease: the lease worker's user for remote attach, the caller's uid
for native attach), and a fractional lease for another uid on that GPU is refused at grant time
with :class:`MpsUserConflict` naming both uids, never left hanging.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("gpuctld.mps")

#: The modes of ``gpuctld --mps``.
MPS_MODES = ("auto", "off", "required")
#: The MPS control program (found on PATH).
CONTROL_PROGRAM = "nvidia-cuda-mps-control"
#: How long a started control daemon may take to create its control pipe, seconds.
START_TIMEOUT_S = 10.0
#: How long ``quit`` may take, seconds.
STOP_TIMEOUT_S = 10.0


class MpsError(Exception):
    """An MPS control daemon could not be started for a GPU (message says why)."""


class MpsUserConflict(MpsError):
    """A GPU's MPS daemon serves another uid (MPS serves one user at a time)."""


@dataclass
class MpsDaemon:
    """The control daemon of one GPU. gpu_uuid: the GPU (or MIG device) UUID it sees. pipe_dir,
    log_dir: its private CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY. uid: the one user it
    serves. leases: ids of the fractional leases using it."""

    gpu_uuid: str
    pipe_dir: Path
    log_dir: Path
    uid: int
    leases: set[str] = field(default_factory=set)


def mps_client_env(*, quota_bytes: int, compute_share: float, pipe_dir: Path | str | None,
                   log_dir: Path | str | None = None) -> dict[str, str]:
    """The MPS variables of a fractional lease's client.

    quota_bytes: the lease's memory quota (bytes) -> ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=<MiB>M"``
    (rounded down to whole MiB so the cap never exceeds the quota; device 0 because the client sees
    only its one GPU through CUDA_VISIBLE_DEVICES, and MPS counts visible devices, not UUIDs).
    compute_share: 0..1 -> ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (percent, integer, at least 1).
    pipe_dir / log_dir: the control daemon's directories (omitted when None).
    """
    env = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={max(1, int(quota_bytes) >> 20)}M",
           "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, min(100, round(compute_share * 100))))}
    if pipe_dir is not None:
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe_dir)
    if log_dir is not None:
        env["CUDA_MPS_LOG_DIRECTORY"] = str(log_dir)
    return env


class MpsManager:
    """Starts and stops the MPS control daemons of one node (thread-safe).

    mode: one of MPS_MODES. root: the directory the daemons' pipe/log directories are made in
    (gpuctld: ``--mps-dir``, default ``<dir of its socket>/mps``).
    program: the control program (default :data:`CONTROL_PROGRAM`, looked up on PATH).
    """

    def __init__(self, mode: str, root: Path | str, *, program: str = CONTROL_PROGRAM):
        if mode not in MPS_MODES:
            raise ValueError(f"mps mode must be one of {', '.join(MPS_MODES)}, got {mode!r}")
        self.mode = mode
        self.root = Path(root)
        self.program = program
        self._lock = threading.Lock()
        self._daemons: dict[str, MpsDaemon] = {}
        self._stopping: dict[str, threading.Thread] = {}  # GPU UUID -> the thread quitting its last daemon
        self.last_error: str | None = None  # why the last acquire in auto mode gave no daemon

    def dirs(self, gpu_uuid: str) -> tuple[Path, Path]:
        """(pipe dir, log dir) of `gpu_uuid`'s daemon, whether or not it runs."""
        # short: a Unix socket path (the pipe dir's "control") must fit in 108 bytes
        base = self.root / "".join(c for c in gpu_uuid.split("-", 1)[-1] if c.isalnum())[:16]
        return base / "pipe", base / "log"

    def running(self) -> dict[str, MpsDaemon]:
        """The daemons running now, by GPU UUID (copies of the lease sets)."""
        with self._lock:
            return {u: MpsDaemon(d.gpu_uuid, d.pipe_dir, d.log_dir, d.uid, set(d.leases))
                    for u, d in self._daemons.items()}

    def acquire(self, gpu_uuid: str, lease_id: str, uid: int) -> MpsDaemon | None:
        """Give fractional lease `lease_id` of user `uid` the MPS daemon of `gpu_uuid`.

        Starts the daemon when none runs for that GPU. Returns it; None when mode is off, or in
        auto mode when it cannot start (the caller grants time-sliced and warns: the reason is
        in :attr:`last_error`). Raises MpsUserConflict when the GPU's daemon serves another uid
        (any mode but off), MpsError when it cannot start and the mode is required.
        """
        self.last_error: str | None = None
        if self.mode == "off":
            return None
        with self._lock:
            d = self._daemons.get(gpu_uuid)
            if d is not None:
                if d.uid != uid:
                    raise MpsUserConflict(
                        f"GPU {gpu_uuid}: its MPS server serves uid {d.uid} (leases {', '.join(sorted(d.leases))}); "
                        f"MPS serves one user at a time, so a fractional lease for uid {uid} cannot share it until "
                        f"those leases end")
                d.leases.add(lease_id)
                return d
            try:
                d = self._start(gpu_uuid, uid)
            except MpsError as e:
                if self.mode == "required":
                    raise
                self.last_error = str(e)
                log.warning("%s; lease %s is time-sliced (no MPS caps)", e, lease_id)
                return None
            d.leases.add(lease_id)
            self._daemons[gpu_uuid] = d
            return d

    def release(self, gpu_uuid: str, lease_id: str) -> bool:
        """Lease `lease_id` no longer uses `gpu_uuid`'s daemon; the daemon is stopped when it was
        the last. Returns True when a daemon was stopped. Never raises (a failed stop is logged)."""
        with self._lock:
            d = self._daemons.get(gpu_uuid)
            if d is None or lease_id not in d.leases:
                return False
            d.leases.discard(lease_id)
            if d.leases:
                return False
            del self._daemons[gpu_uuid]
            # quit off the caller's path: MPS's quit waits for its server to exit (seconds), and a
            # lease's release must answer at once; a new daemon for this GPU waits for it (_start)
            t = threading.Thread(target=self._stop, args=(d,), daemon=True, name=f"gpuctld-mps-quit-{gpu_uuid[:12]}")
            self._stopping[gpu_uuid] = t
            t.start()
            return True

    def quiesce(self, timeout_s: float = 2 * STOP_TIMEOUT_S) -> None:
        """Wait until the daemons being quit (after their last lease's release) are gone."""
        with self._lock:
            stopping = list(self._stopping.values())
        for t in stopping:
            t.join(timeout_s)

    def close(self) -> None:
        """Stop every daemon (gpuctld shutdown). Never raises."""
        with self._lock:
            daemons, self._daemons = list(self._daemons.values()), {}
            stopping, self._stopping = list(self._stopping.values()), {}
        for d in daemons:
            self._stop(d)
        for t in stopping:
            t.join(2 * STOP_TIMEOUT_S)

    # ------------------------------------------------------------------ the control program

    def _env(self, gpu_uuid: str, pipe_dir: Path, log_dir: Path) -> dict[str, str]:
        env = dict(os.environ)
        env.update(CUDA_VISIBLE_DEVICES=gpu_uuid, CUDA_DEVICE_ORDER="PCI_BUS_ID",
                   CUDA_MPS_PIPE_DIRECTORY=str(pipe_dir), CUDA_MPS_LOG_DIRECTORY=str(log_dir))
        return env

    def _start(self, gpu_uuid: str, uid: int) -> MpsDaemon:
        quitting = self._stopping.pop(gpu_uuid, None)
        if quitting is not None:  # this GPU's last daemon is still quitting: let it finish first
            quitting.join(2 * STOP_TIMEOUT_S)
        pipe_dir, log_dir = self.dirs(gpu_uuid)
        where = f"GPU {gpu_uuid}: MPS control daemon did not start"
        exe = shutil.which(self.program)
        if exe is None:
            raise MpsError(f"{where}: {self.program} not found on PATH (install the NVIDIA driver's MPS tools)")
        for p in (pipe_dir, log_dir):
            p.mkdir(parents=True, exist_ok=True, mode=0o700)
        if (pipe_dir / "control").exists():  # left by a gpuctld that was killed: it serves nobody now
            log.warning("GPU %s: an MPS control daemon left in %s by a former gpuctld: quitting it first",
                        gpu_uuid, pipe_dir)
            self._stop(MpsDaemon(gpu_uuid=gpu_uuid, pipe_dir=pipe_dir, log_dir=log_dir, uid=uid))
            (pipe_dir / "control").unlink(missing_ok=True)  # a FIFO with no daemon behind it ("Cannot find ...")
        try:
            proc = subprocess.run([exe, "-d"], env=self._env(gpu_uuid, pipe_dir, log_dir), stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=START_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise MpsError(f"{where}: {type(e).__name__}: {e}") from None
        if proc.returncode != 0:
            text = (proc.stderr or proc.stdout).decode(errors="replace").strip()[-400:]
            raise MpsError(f"{where}: {self.program} -d exited {proc.returncode}: {text or 'no message'}")
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (pipe_dir / "control").exists():
            if time.monotonic() > deadline:
                raise MpsError(f"{where}: no control pipe in {pipe_dir} after {START_TIMEOUT_S:g} s")
            time.sleep(0.02)
        log.info("GPU %s: MPS control daemon started (pipe %s, uid %d)", gpu_uuid, pipe_dir, uid)
        return MpsDaemon(gpu_uuid=gpu_uuid, pipe_dir=pipe_dir, log_dir=log_dir, uid=uid)

    def _stop(self, d: MpsDaemon) -> None:
        exe = shutil.which(self.program) or self.program
        try:
            proc = subprocess.run([exe], input=b"quit\n", env=self._env(d.gpu_uuid, d.pipe_dir, d.log_dir),
                                  capture_output=True, timeout=STOP_TIMEOUT_S)
            if proc.returncode != 0:
                log.error("GPU %s: MPS quit exited %d: %s", d.gpu_uuid, proc.returncode,
                          proc.stderr.decode(errors="replace").strip()[-400:])
            # The real control daemon leaves its `control` FIFO behind when it quits (seen on the
            # H200): give it a moment, then remove a FIFO nobody serves so that a stale pipe is
            # never taken for a running daemon (which made the next start wait and quit again).
            deadline = time.monotonic() + 1.0
            while (d.pipe_dir / "control").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            if proc.returncode == 0:
                (d.pipe_dir / "control").unlink(missing_ok=True)
            log.info("GPU %s: MPS control daemon stopped", d.gpu_uuid)
        except (OSError, subprocess.TimeoutExpired) as e:
            log.error("GPU %s: stopping the MPS control daemon failed: %s", d.gpu_uuid, e)
