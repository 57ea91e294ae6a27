"""Start and stop real `gpuctld` processes for tests (simulated backend, temp socket and state dir).

Usage::

    from daemon_proc import start_daemon

    d = start_daemon(tmp_path, gpus=8, seed=1)
    try:
        with d.client() as c:
            c.get("/v1/status").json()
        d.kill9(); d.restart()
    finally:
        d.stop()

or as a context manager: ``with start_daemon(tmp_path) as d: ...`` (stopped on exit).

The daemon runs as ``sys.executable -m gpuctl.daemon`` with this checkout on PYTHONPATH; its
stderr goes to ``<dir>/gpuctld.stderr.log`` (``d.stderr_text()``). Unix socket paths are limited to
~108 bytes, so when the test's directory is too deep the socket goes into a short /tmp directory
(removed by ``stop()``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from gpuctl.transport.uds_http import uds_client as _uds_client

REPO_ROOT = Path(__file__).resolve().parents[2]
#: Longest socket path used as is (the kernel's limit is 107 bytes).
MAX_SOCKET_PATH_CHARS = 100


class DaemonStartError(Exception):
    """The daemon exited, or did not answer /v1/health, while starting; the message has its stderr."""


def uds_client(socket_path: str | os.PathLike, timeout_s: float = 5.0) -> httpx.Client:
    """An httpx client on the daemon's Unix socket (base URL http://gpuctld)."""
    return _uds_client(str(socket_path), timeout_s)


class DaemonProc:
    """One gpuctld process (restartable with the same socket, state dir and options).

    socket_path, state_dir: paths. args: the daemon's command-line options. proc: the running
    subprocess.Popen, or None before start / after stop. log_path: where its stderr goes.
    """

    def __init__(self, socket_path: Path, state_dir: Path, args: list[str], log_path: Path,
                 env: dict[str, str] | None = None, cleanup_dir: Path | None = None):
        self.socket_path = socket_path
        self.state_dir = state_dir
        self.args = args
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen | None = None
        self._cleanup_dir = cleanup_dir

    @property
    def pid(self) -> int | None:
        """The process id of the running daemon (None when not started)."""
        return self.proc.pid if self.proc else None

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "gpuctl.daemon", *self.args]

    def start(self, wait: bool = True, timeout_s: float = 20.0) -> "DaemonProc":
        """Start the process (stderr appended to log_path); with `wait`, until /v1/health answers."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        env.update(self.env or {})
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         env=env, cwd=str(REPO_ROOT))
        if wait:
            self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        """Wait until GET /v1/health answers 200. Raises DaemonStartError (with stderr) if the
        process exits first or `timeout_s` passes."""
        assert self.proc is not None, "not started"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise DaemonStartError(f"gpuctld exited with {rc} while starting:\n{self.stderr_text()}")
            if self.socket_path.exists():
                try:
                    with uds_client(self.socket_path, timeout_s=1.0) as c:
                        r = c.get("/v1/health")
                    if r.status_code == 200 and r.json().get("pid") == self.proc.pid:
                        return
                except httpx.TransportError:
                    pass
            time.sleep(0.02)
        raise DaemonStartError(f"gpuctld did not answer /v1/health within {timeout_s} s:\n{self.stderr_text()}")

    def wait_exit(self, timeout_s: float = 20.0) -> int:
        """Wait for the process to end; its exit status (kills it and raises on timeout)."""
        assert self.proc is not None, "not started"
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill9()
            raise

    def client(self, timeout_s: float = 5.0) -> httpx.Client:
        """An httpx client on this daemon's socket."""
        return uds_client(self.socket_path, timeout_s)

    def stderr_text(self) -> str:
        """Everything the daemon has written to stderr so far (all starts)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def kill9(self) -> None:
        """SIGKILL the daemon and reap it (the socket file stays behind, as after a crash)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM and wait (SIGKILL after `timeout_s`); returns the exit status (None if never
        started). Idempotent; removes the short socket directory if one was made."""
        rc = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
            rc = self.proc.returncode
        if self._cleanup_dir is not None:
            shutil.rmtree(self._cleanup_dir, ignore_errors=True)
        return rc

    def restart(self, wait: bool = True, timeout_s: float = 20.0) -> "DaemonProc":
        """Stop it if running (SIGTERM) and start it again with the same options."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)
        return self.start(wait=wait, timeout_s=timeout_s)

    def __enter__(self) -> "DaemonProc":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_daemon(
    tmp_path: str | os.PathLike,
    gpus: int = 8,
    seed: int = 1,
    name: str | None = None,
    *,
    interval_s: float = 0.2,
    extra_args: list[str] | tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    wait: bool = True,
    timeout_s: float = 20.0,
) -> DaemonProc:
    """Start a simulated gpuctld under `tmp_path` (``<tmp_path>/<name or 'gpuctld'>/state`` and a
    socket next to it) and, with `wait`, wait until it answers /v1/health. With ``wait=False`` use
    ``wait_exit()`` for a daemon that is expected to refuse to start. Raises DaemonStartError."""
    base = Path(tmp_path) / (name or "gpuctld")
    base.mkdir(parents=True, exist_ok=True)
    state_dir = base / "state"
    socket_path = base / "gpuctld.sock"
    cleanup = None
    if len(str(socket_path)) > MAX_SOCKET_PATH_CHARS:
        cleanup = Path(tempfile.mkdtemp(prefix="gpuctld-", dir="/tmp"))
        socket_path = cleanup / "gpuctld.sock"
    args = [
        "serve", "--backend", "simulated", "--gpus", str(gpus), "--seed", str(seed),
        "--state-dir", str(state_dir), "--socket", str(socket_path), "--interval", str(interval_s),
        *extra_args,
    ]
    d = DaemonProc(socket_path, state_dir, args, base / "gpuctld.stderr.log", env=env, cleanup_dir=cleanup)
    try:
        d.start(wait=wait, timeout_s=timeout_s)
    except BaseException:
        d.stop()
        raise
    return d
