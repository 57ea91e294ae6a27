"""How gpuctld starts the data-path worker of a lease: :func:`start_worker` -> :class:`WorkerHandle`.

The worker's stdin is the control pipe: the launcher writes the token (hex, first line) into it
and keeps it open. ``extend()`` writes a new deadline, ``stop()`` writes ``stop`` and waits, and
if the daemon dies the pipe closes and the worker exits. The worker also exits by itself at its
deadline. It reports ``ready HOST:PORT`` on stdout; start_worker waits for that line.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

READY_TIMEOUT_S = 30.0


class WorkerStartError(RuntimeError):
    """The worker did not report ready: the message carries its exit status and stderr tail."""


@dataclass
class WorkerHandle:
    """A running worker. endpoint: "host:port" clients connect to. pid: its process id.
    run_dir: where it writes stats.json (and stderr.log)."""

    lease_id: str
    endpoint: str
    pid: int
    run_dir: str
    proc: subprocess.Popen = field(repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def alive(self) -> bool:
        """True while the worker process runs."""
        return self.proc.poll() is None

    def extend(self, expires_at_s: float) -> None:
        """Move the worker's deadline to `expires_at_s` (Unix seconds), e.g. after a lease heartbeat.
        Raises ProcessLookupError when the worker has already ended."""
        self._send(f"expires {float(expires_at_s):.3f}\n")

    def stop(self, timeout_s: float = 5.0) -> int:
        """Stop the worker (control pipe, then SIGTERM, then SIGKILL) and return its exit status."""
        if self.alive():
            try:
                self._send("stop\n")
            except ProcessLookupError:
                pass
            try:
                return self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    return self.proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
        rc = self.proc.wait()
        self._close_pipe()
        return rc

    def stats(self) -> dict[str, Any] | None:
        """The worker's last stats.json (see accounting.LeaseAccounting.snapshot), or None if not yet
        written."""
        try:
            with open(os.path.join(self.run_dir, "stats.json"), encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def _send(self, line: str) -> None:
        with self._lock:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(line.encode())
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                raise ProcessLookupError(f"worker of lease {self.lease_id} (pid {self.pid}) has ended") from None

    def _close_pipe(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f:
                    f.close()
            except OSError:
                pass


def start_worker(
    *,
    lease_id: str,
    token: bytes,
    quota_bytes: int,
    compute_share: float,
    executor: str,
    gpu_uuid: str | None = None,
    bind: str = "127.0.0.1",
    port: int = 0,
    expires_at_s: float,
    run_as_user: str | None = None,
    run_dir: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    mps_pipe_dir: str | None = None,
) -> WorkerHandle:
    """Start the worker of lease `lease_id` and wait until it listens.

    token: the lease token (raw bytes; sent through the stdin pipe, never argv/env). quota_bytes:
    the slices' memory quota (bytes). compute_share: 0..1 of the GPU. executor: "numpy" or "cupy"
    (cupy needs gpu_uuid: the worker sees only that GPU, pinned by UUID, never by NVML index:
    CUDA_VISIBLE_DEVICES=<GPU or MIG device UUID>, CUDA_DEVICE_ORDER=PCI_BUS_ID).
    mps_pipe_dir: the MPS control daemon gpuctld started for this GPU (gpuctl.daemon.mps); when
    given, the worker is its client: CUDA_MPS_PIPE_DIRECTORY = it and
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = compute_share * 100 (cupy only).
    expires_at_s: lease expiry (Unix seconds). run_as_user: drop to this user (needs root).
    run_dir: directory for stats.json and stderr.log (a new temporary one by default).

    Raises ValueError for bad arguments, WorkerStartError when the worker does not come up
    (with its stderr tail), KeyError for an unknown run_as_user.
    """
    if executor not in ("numpy", "cupy"):
        raise ValueError(f"executor: {executor!r} is not one of numpy, cupy")
    if executor == "cupy" and not gpu_uuid:
        raise ValueError("gpu_uuid: the cupy executor needs the lease's GPU UUID")
    if not token:
        raise ValueError("token: empty lease token")
    if quota_bytes <= 0:
        raise ValueError(f"quota_bytes: must be > 0, got {quota_bytes}")
    if not 0 < compute_share <= 1:
        raise ValueError(f"compute_share: must be in (0, 1], got {compute_share}")
    if expires_at_s <= time.time():
        raise ValueError(f"expires_at_s: lease {lease_id} has already expired")
    run_dir = run_dir or tempfile.mkdtemp(prefix=f"gpuctl-lease-{lease_id}-")
    os.makedirs(run_dir, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCTL_ATTACH")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in [_package_root(), env.get("PYTHONPATH", "")] if p)
    for k in [k for k in env if k.startswith("CUDA_MPS_")]:
        del env[k]  # only the MPS daemon gpuctld started for this GPU, never one inherited
    if gpu_uuid:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu_uuid)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if mps_pipe_dir and executor == "cupy":
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(mps_pipe_dir)
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, round(compute_share * 100)))
    # -P and cwd=run_dir: the daemon's working directory never lands on the worker's sys.path
    argv = [sys.executable, "-P", "-m", "gpuctl.datapath.worker", "--lease-id", lease_id, "--executor", executor,
            "--quota-bytes", str(int(quota_bytes)), "--compute-share", str(compute_share),
            "--bind", bind, "--port", str(int(port)), "--expires-at-s", f"{expires_at_s:.3f}",
            "--run-dir", run_dir]
    if tls_cert:
        argv += ["--tls-cert", tls_cert, "--tls-key", tls_key or tls_cert]
    kwargs: dict[str, Any] = {}
    if run_as_user is not None:
        pw = pwd.getpwnam(run_as_user)
        if os.geteuid() == 0:
            os.chown(run_dir, pw.pw_uid, pw.pw_gid)
            kwargs.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
            env["HOME"] = pw.pw_dir
    stderr_path = os.path.join(run_dir, "stderr.log")
    with open(stderr_path, "ab") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env,
                                close_fds=True, start_new_session=True, cwd=run_dir, **kwargs)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(token.hex().encode() + b"\n")
        proc.stdin.flush()
    except BrokenPipeError:
        pass
    line = _read_ready(proc, READY_TIMEOUT_S)
    if not line.startswith("ready "):
        try:
            proc.kill()
        except OSError:
            pass
        proc.wait()
        tail = _tail(stderr_path)
        raise WorkerStartError(f"worker of lease {lease_id} did not start (exit {proc.returncode}): {tail}")
    return WorkerHandle(lease_id=lease_id, endpoint=line.split(None, 1)[1], pid=proc.pid, run_dir=run_dir, proc=proc)


def _read_ready(proc: subprocess.Popen, timeout_s: float) -> str:
    out: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        out.append(proc.stdout.readline().decode(errors="replace").strip())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout_s)
    return out[0] if out else ""


def _tail(path: str, nbytes: int = 2000) -> str:
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:  # run dir: the worker user's
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - nbytes))
            return f.read().decode(errors="replace").strip() or "(no stderr)"
    except OSError:
        return "(no stderr)"


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
