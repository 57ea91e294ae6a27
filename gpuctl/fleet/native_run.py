"""`gpuctl run --native`: run a program ON the leased node, pinned to the lease's slice natively.

The lease is granted with ``attach = "native"``; its answer carries ``env``, the variables that
bind the program to the slice (gpuctl.daemon.native.native_env: ``CUDA_VISIBLE_DEVICES=<GPU or
MIG device UUID>``, ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, and for a fraction the MPS memory cap,
thread percentage and pipe directory). :func:`start_native` starts the program with them and
returns a Popen-like handle (``pid``, ``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill``,
``returncode``), so `gpuctl run` waits for it, forwards signals and releases the lease exactly as it
does for a local child:

- a node with ``transport = "local"`` (its gpuctld is on this machine): the program is a child
  process of gpuctl (:class:`subprocess.Popen`), stdin/stdout/stderr inherited.
- an SSH node: the program runs on the node over an exec channel of the node's SSH connection
  (:class:`SshProcess`): stdout/stderr are streamed to gpuctl's as they come, stdin is /dev/null,
  signals are forwarded with ``kill -s SIG PID`` over another channel of the same connection, and
  the exit status is the program's (128 + N when signal N killed it; 127: not found; 126: --cwd
  cannot be entered).

Either way the program's pid on the node is recorded with the lease (``POST
/v1/leases/ID/processes``), so the node's telemetry attributes its GPU use to the lease and a
revoke or an expiry ends it even when gpuctl is gone.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Any, BinaryIO

#: The line the wrapper writes to stderr before the program starts (then removed from the stream).
_PID_LINE = re.compile(rb"gpuctl-native-pid (\d+)\n")
#: How long a forwarded signal waits for the remote pid to be known, seconds.
PID_WAIT_S = 10.0


class NativeStartError(Exception):
    """The program could not be started: `message`, `exit_code` (126/127 like a shell, or 7)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def remote_command(command: list[str], env: dict[str, str], cwd: str | None) -> str:
    """The shell command line run on the node for `command` (argv) with `env` in `cwd`.

    ``env K=V... sh -c OUTER gpuctl-native DIR CMD...``: OUTER enters DIR (126 when it cannot)
    and runs an inner ``sh`` in the foreground with stdin /dev/null (not as a background job: a
    non-interactive shell starts those with SIGINT ignored, and a forwarded Ctrl-C would be lost);
    the inner sh writes ``gpuctl-native-pid <its pid>`` to stderr, then execs CMD (so that pid is
    CMD's, and the line comes before anything CMD writes); OUTER then exits with CMD's status
    (128 + N when signal N killed it: ``exit $?`` keeps the shell from exec'ing the last command,
    whose death by a signal sshd would report as exit-signal, which paramiko does not read). Every
    word is quoted.
    """
    inner = 'echo "gpuctl-native-pid $$" >&2; exec "$@"'
    outer = f'cd -- "$1" || exit 126; shift; sh -c {shlex.quote(inner)} gpuctl-native "$@" </dev/null; exit $?'
    words = ["env", *(f"{k}={v}" for k, v in sorted(env.items())), "sh", "-c", outer, "gpuctl-native",
             cwd or ".", *command]
    return " ".join(shlex.quote(w) for w in words)


class SshProcess:
    """A program running on a node over an SSH exec channel, with a Popen-like interface.

    transport: the node's SshTransport (its connection is shared with the control API).
    command/env/cwd: see :func:`remote_command`. stdout/stderr: where its output goes (binary
    files; default gpuctl's own). ``pid`` is the program's pid on the node once known (None
    before). Raises TransportError when the node cannot be reached.
    """

    shares_terminal = False  # a Ctrl-C typed here does not reach it: gpuctl forwards every SIGINT

    def __init__(self, transport: Any, command: list[str], env: dict[str, str], cwd: str | None = None, *,
                 stdout: BinaryIO | None = None, stderr: BinaryIO | None = None):
        self.transport = transport
        self.args = list(command)
        self.pid: int | None = None
        self.returncode: int | None = None
        self.connection_lost = False
        self._out = stdout or sys.stdout.buffer
        self._err = stderr or sys.stderr.buffer
        self._pid_known = threading.Event()
        self._channel = transport.exec_channel(remote_command(command, env, cwd))
        self._pump = threading.Thread(target=self._run_pump, name="gpuctl-native-ssh", daemon=True)
        self._pump.start()

    def wait_pid(self, timeout_s: float = PID_WAIT_S) -> int | None:
        """The program's pid on the node, waiting up to `timeout_s` for it (None: it never started)."""
        self._pid_known.wait(timeout_s)
        return self.pid

    def _run_pump(self) -> None:
        ch = self._channel
        pending = b""  # stderr held back until the pid line is seen
        try:
            while True:
                moved = False
                while ch.recv_ready():
                    data = ch.recv(65536)
                    if data:
                        self._write(self._out, data)
                        moved = True
                while ch.recv_stderr_ready():
                    data = ch.recv_stderr(65536)
                    if not data:
                        break
                    moved = True
                    if self._pid_known.is_set():
                        self._write(self._err, data)
                        continue
                    pending += data
                    m = _PID_LINE.search(pending)
                    if m:
                        self.pid = int(m.group(1))
                        self._pid_known.set()
                        pending = pending[:m.start()] + pending[m.end():]
                        if pending:
                            self._write(self._err, pending)
                        pending = b""
                if moved:
                    continue
                if ch.exit_status_ready() and not ch.recv_ready() and not ch.recv_stderr_ready():
                    break
                if ch.closed and not ch.recv_ready() and not ch.recv_stderr_ready():
                    break
                ch.status_event.wait(0.02)
        except (OSError, EOFError):
            pass
        finally:
            if pending:
                self._write(self._err, pending)
            status = ch.exit_status if ch.exit_status_ready() else -1
            self.connection_lost = status < 0
            self.returncode = status if status >= 0 else 255
            self._pid_known.set()
            try:
                ch.close()
            except Exception:  # noqa: BLE001 - closing a dead channel
                pass

    @staticmethod
    def _write(f: BinaryIO, data: bytes) -> None:
        try:
            f.write(data)
            f.flush()
        except (OSError, ValueError):
            pass

    def poll(self) -> int | None:
        """The exit status once the program has ended and its output is all written, else None."""
        return None if self._pump.is_alive() else self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the end; raises subprocess.TimeoutExpired after `timeout` seconds."""
        self._pump.join(timeout)
        if self._pump.is_alive():
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Send `sig` to the program on the node (``kill -s NAME PID`` over another channel)."""
        pid = self.wait_pid()
        if pid is None or self.poll() is not None:
            return
        name = signal.Signals(sig).name.removeprefix("SIG")
        try:
            self.transport.run(f"kill -s {name} {int(pid)}", timeout_s=10)
        except Exception:  # noqa: BLE001 - the connection is gone: the lease's expiry ends the program
            pass

    def terminate(self) -> None:
        """SIGTERM to the program."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the program, then close the channel."""
        self.send_signal(signal.SIGKILL)


class LocalProcess(subprocess.Popen):
    """A native program on this machine (the node's transport is local): a plain child process.

    With `out` / `err` (binary writers, e.g. a multi-node job's prefixed streams) its stdout /
    stderr are piped to them by two threads, and :meth:`wait` returns once both have drained
    (at most PUMP_DRAIN_S after the program's end: a grandchild may hold the pipe open)."""

    shares_terminal = True  # a Ctrl-C typed here reaches it directly (same foreground process group)

    def __init__(self, *args: Any, out: Any = None, err: Any = None, **kwargs: Any):
        self._pumps: list[threading.Thread] = []
        self._ended_at: float | None = None
        if out is not None:
            kwargs["stdout"] = subprocess.PIPE
        if err is not None:
            kwargs["stderr"] = subprocess.PIPE
        super().__init__(*args, **kwargs)
        self._pumps = [threading.Thread(target=_copy, args=(src, dst), daemon=True, name="gpuctl-native-out")
                       for src, dst in ((self.stdout, out), (self.stderr, err)) if dst is not None]
        for t in self._pumps:
            t.start()

    def wait(self, timeout: float | None = None) -> int:
        rc = super().wait(timeout)
        for t in self._pumps:
            t.join(PUMP_DRAIN_S)
        return rc

    def poll(self) -> int | None:
        """The exit status once the program has ended and its output is drained (or
        PUMP_DRAIN_S have passed since its end), else None."""
        rc = super().poll()
        if rc is None or not any(t.is_alive() for t in self._pumps):
            return rc
        if self._ended_at is None:
            self._ended_at = time.monotonic()
        return rc if time.monotonic() - self._ended_at > PUMP_DRAIN_S else None


#: How long a local program's output pumps may run on after it ended, seconds.
PUMP_DRAIN_S = 5.0


def _copy(src: BinaryIO, dst: Any) -> None:
    """Copy a pipe to a writer until end of file."""
    try:
        while True:
            data = src.read1(65536) if hasattr(src, "read1") else src.read(65536)
            if not data:
                break
            dst.write(data)
    except (OSError, ValueError):
        pass


def start_native(node: Any, transport: Any, answer: dict[str, Any], command: list[str],
                 cwd: str | None = None, *, stdout: Any = None, stderr: Any = None) -> Any:
    """Start `command` natively for the granted lease `answer` (it must hold ``env``).

    node: the fleet config's node (``transport`` is "local" or "ssh"). transport: that node's
    open transport (NodeClient.transport()). cwd: the directory on the node (local default: the
    current one; SSH default: the login directory). stdout/stderr: binary writers the program's
    output goes to (default: gpuctl's own). Returns LocalProcess or SshProcess. Raises
    NativeStartError (127: not found, 126: not executable or bad --cwd) for a local program;
    TransportError for an SSH node that cannot be reached.
    """
    env = dict(answer.get("env") or {})
    if not env.get("CUDA_VISIBLE_DEVICES"):
        raise NativeStartError("the node's answer has no native environment (CUDA_VISIBLE_DEVICES): is its "
                               "gpuctld older than this gpuctl?", 1)
    if getattr(node, "transport", "ssh") == "local":
        full = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
        full.update(env)
        try:
            return LocalProcess(command, env=full, cwd=cwd, out=stdout, err=stderr)
        except FileNotFoundError as e:
            if cwd and not os.path.isdir(cwd):
                raise NativeStartError(f"--cwd {cwd}: no such directory", 126) from None
            raise NativeStartError(f"cannot start {command[0]!r}: {e.strerror or e}", 127) from None
        except OSError as e:
            raise NativeStartError(f"cannot start {command[0]!r}: {e.strerror or e}", 126) from None
    return SshProcess(transport, command, env, cwd, stdout=stdout, stderr=stderr)


def record_pid(client: Any, lease_id: str, proc: Any, err: Any) -> None:
    """Record the program's pid on the node with its lease (best effort: a program that has
    already ended, or a node that refuses, is said on stderr and the run goes on)."""
    pid = proc.wait_pid() if hasattr(proc, "wait_pid") else proc.pid
    if pid is None:
        return
    try:
        client.record_processes(lease_id, [pid])
    except Exception as e:  # noqa: BLE001 - attribution is not worth failing the run for
        if proc.poll() is None:
            err(f"could not record process {pid} with lease {lease_id}: {e}")


def forward_sigint(count: int) -> bool:
    """Whether gpuctl forwards its `count`-th SIGINT to a program that shares its terminal: a
    SIGINT typed at the terminal already reached it (same foreground process group), so only the
    second is forwarded, or one that came from elsewhere (no terminal, or gpuctl not in the
    foreground)."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return count >= 2
    except OSError:
        pass
    return True


def describe_env(env: dict[str, str]) -> str:
    """The native variables in one line for stderr (K=V, sorted)."""
    return " ".join(f"{k}={v}" for k, v in sorted(env.items()))


def wait_or_kill(proc: Any, grace_s: float) -> None:
    """SIGTERM `proc`, wait up to grace_s, then SIGKILL (a program that outlives its lease)."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
