"""A Unix-socket proxy in front of a real gpuctld that loses or delays what a flaky network would.

The client side (gpuctl's LocalTransport) connects to `proxy.socket_path`; every connection is
forwarded to the daemon's socket byte for byte. A fault is armed for the next N requests whose
first bytes match `match` (default ``POST /v1/assign``), so snapshots and look-ups pass through:

- ``lose_answer``: the request reaches the daemon (which applies it), its answer is swallowed and
  the client's connection closed: the client sees a dropped connection, the node has moved.
- ``delay_answer``: the answer is held `delay_s` seconds (past the client's timeout), then sent.
- ``lose_request``: the request never reaches the daemon; the client's connection is closed.
- ``freeze``: the daemon process is stopped (SIGSTOP) before the request is forwarded, as a node
  frozen mid-request; `thaw()` continues it (SIGCONT).

`down()` stops listening (connections are refused, as a node that is off), `up()` listens again.
Used by tests/test_reassign_lost_answer.py and bench/torture_lost_answer.py.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
import time
from pathlib import Path

FAULTS = ("lose_answer", "delay_answer", "lose_request", "freeze")


class LossyProxy:
    """Proxy `socket_path` -> `target` (a gpuctld socket). daemon_pid: the process `freeze` stops.

    Counters: `faults_applied` (requests a fault hit), `connections`. `late_answers`: answers the
    daemon sent after its client had gone (read for up to 30 s after the client closed)."""

    def __init__(self, socket_path: str | os.PathLike, target: str | os.PathLike, daemon_pid: int | None = None):
        self.socket_path = str(socket_path)
        self.target = str(target)
        self.daemon_pid = daemon_pid
        self._lock = threading.Lock()
        self._fault: str | None = None
        self._fault_left = 0
        self._match = b"POST /v1/assign"
        self.delay_s = 0.0
        self.faults_applied = 0
        self.connections = 0
        self.late_answers: list[bytes] = []
        self._frozen = False
        self._listener: socket.socket | None = None
        self._closing = False
        self._threads: list[threading.Thread] = []
        self._conns: set[socket.socket] = set()

    # -- control

    def arm(self, fault: str, count: int = 1, *, delay_s: float = 0.0, match: bytes = b"POST /v1/assign") -> None:
        """Apply `fault` (one of FAULTS) to the next `count` requests starting with `match`."""
        if fault not in FAULTS:
            raise ValueError(f"fault {fault!r}: one of {', '.join(FAULTS)}")
        with self._lock:
            self._fault, self._fault_left, self.delay_s, self._match = fault, count, delay_s, match

    def disarm(self) -> None:
        with self._lock:
            self._fault, self._fault_left = None, 0

    def _take_fault(self, head: bytes) -> str | None:
        with self._lock:
            if self._fault and self._fault_left > 0 and head.startswith(self._match):
                self._fault_left -= 1
                self.faults_applied += 1
                fault = self._fault
                if self._fault_left == 0:
                    self._fault = None
                return fault
        return None

    def thaw(self) -> None:
        """Continue the daemon stopped by a `freeze` fault (no-op when none is stopped)."""
        if self._frozen and self.daemon_pid:
            os.kill(self.daemon_pid, signal.SIGCONT)
            self._frozen = False

    def up(self) -> "LossyProxy":
        """Listen on socket_path (again) and serve connections in threads."""
        if self._listener is not None:
            return self
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(self.socket_path)
        s.listen(64)
        self._listener = s
        self._closing = False
        t = threading.Thread(target=self._accept_loop, args=(s,), daemon=True, name="lossy-proxy")
        t.start()
        self._threads.append(t)
        return self

    def down(self) -> None:
        """Stop listening and cut every open connection: the node is off (connections refused)."""
        s, self._listener = self._listener, None
        self._closing = True
        if s is not None:
            s.close()
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        for c in list(self._conns):
            _close(c)

    def close(self) -> None:
        """down(), and continue a frozen daemon."""
        self.thaw()
        self.down()

    def __enter__(self) -> "LossyProxy":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- serving

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            self.connections += 1
            t = threading.Thread(target=self._serve, args=(client,), daemon=True, name="lossy-proxy-conn")
            t.start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conns.update((client, upstream))
        try:
            upstream.connect(self.target)
        except OSError:
            _close(client)
            _close(upstream)
            return
        fault: str | None = None
        fresh_request = True  # the next client bytes begin a request (HTTP/1.1, no pipelining)
        try:
            while not self._closing:
                ready, _, _ = select.select([client, upstream], [], [], 0.5)
                if client in ready:
                    data = client.recv(65536)
                    if not data:
                        if not fresh_request:  # a request is outstanding: keep its late answer
                            self._drain_late(upstream)
                        return
                    if fresh_request:
                        fault = self._take_fault(data)
                        fresh_request = False
                    if fault == "lose_request":
                        return
                    if fault == "freeze" and self.daemon_pid and not self._frozen:
                        os.kill(self.daemon_pid, signal.SIGSTOP)
                        self._frozen = True
                        _wait_stopped(self.daemon_pid)  # the request must arrive at a stopped daemon
                    upstream.sendall(data)
                if upstream in ready:
                    data = upstream.recv(65536)
                    if not data:
                        return
                    fresh_request = True
                    if fault == "lose_answer":
                        return
                    if fault == "delay_answer":
                        time.sleep(self.delay_s)
                    fault = None
                    try:
                        client.sendall(data)
                    except OSError:  # the client gave up while the answer was held
                        self.late_answers.append(data)
                        return
        except OSError:
            return
        finally:
            self._conns.discard(client)
            self._conns.discard(upstream)
            _close(client)
            _close(upstream)


    def _drain_late(self, upstream: socket.socket) -> None:
        upstream.settimeout(30.0)
        try:
            data = upstream.recv(65536)
        except OSError:
            return
        if data:
            self.late_answers.append(data)


def _wait_stopped(pid: int, timeout_s: float = 5.0) -> None:
    """Wait until every thread of `pid` is stopped (state T in /proc/PID/task/*/stat)."""
    until = time.monotonic() + timeout_s
    while time.monotonic() < until:
        states = []
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
        except OSError:
            return
        if states and all(st in ("T", "t") for st in states):
            return
        time.sleep(0.001)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()


def short_socket_dir() -> Path:
    """A fresh short directory under /tmp for sockets (Unix socket paths are limited to ~107 bytes)."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix="gpuctl-px-", dir="/tmp"))
