"""`gpuctld bridge`: stdin/stdout joined to the daemon's Unix socket; the default socket rule."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import threading

import pytest

from daemon_proc import REPO_ROOT

from gpuctl.daemon import bridge, paths
from gpuctl.transport import ssh as ssh_transport

REQUEST = b"GET /v1/health HTTP/1.1\r\nHost: gpuctld\r\n\r\n"
ANSWER = b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{"ok":true}'


class OneShotServer:
    """A Unix socket server answering ANSWER to the first request (read until the blank line),
    then closing. received: bytes it read."""

    def __init__(self, path: str):
        self.path = path
        self.received = b""
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(1)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        conn, _ = self.sock.accept()
        with conn:
            while b"\r\n\r\n" not in self.received:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                self.received += chunk
            conn.sendall(ANSWER)

    def close(self):
        self.thread.join(5)
        self.sock.close()


def run_bridge(args: list[str], stdin: bytes, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "gpuctl.daemon.bridge", *args],
        input=stdin, capture_output=True, timeout=20, env=full_env,
    )


def test_bridge_relays_both_ways_and_announces_ready(tmp_path):
    path = str(tmp_path / "d.sock")
    server = OneShotServer(path)
    try:
        # stdin closes right after the request: the bridge still relays the whole answer
        done = run_bridge(["bridge", "--socket", path], REQUEST)
    finally:
        server.close()
    assert done.returncode == 0
    assert server.received == REQUEST
    assert done.stdout == ANSWER
    assert done.stderr.decode() == f"{bridge.READY_LINE_PREFIX}{path}\n"


def test_bridge_missing_socket_exit_2_with_message(tmp_path):
    path = tmp_path / "nope.sock"
    done = run_bridge(["--socket", str(path)], b"")
    assert done.returncode == bridge.EXIT_UNREACHABLE == 2
    assert done.stderr.decode() == f"gpuctld is not running on this node: no socket at {path}\n"
    assert done.stdout == b""
    assert not path.exists()


def test_bridge_stale_socket_file_is_refused(tmp_path):
    path = str(tmp_path / "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)  # the file exists, nobody listens (a daemon that crashed)
    s.close()
    with pytest.raises(bridge.BridgeError) as info:
        bridge.connect([path])
    assert str(info.value) == f"gpuctld is not running on this node: nothing listens on {path} (stale socket file)"
    assert os.path.exists(path)  # the bridge never removes the daemon's files


def test_bridge_default_tries_candidates_in_order(tmp_path, monkeypatch):
    missing = str(tmp_path / "user.sock")
    system = str(tmp_path / "system.sock")
    server = OneShotServer(system)
    try:
        sock, used = bridge.connect([missing, system])
        with sock:
            sock.sendall(REQUEST)
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
        assert used == system
        assert answer == ANSWER
    finally:
        server.close()
    with pytest.raises(bridge.BridgeError) as info:
        bridge.connect([missing, str(tmp_path / "other.sock")])
    assert str(info.value) == (
        f"gpuctld is not running on this node: no socket at {missing} or {tmp_path / 'other.sock'}"
    )


def test_bridge_permission_denied_names_socket(tmp_path, monkeypatch):
    path = str(tmp_path / "d.sock")
    open(path, "w").close()

    class DeniedSocket:
        def __init__(self, *a):
            pass

        def connect(self, p):
            raise PermissionError(errno.EACCES, "Permission denied")

        def close(self):
            pass

    monkeypatch.setattr(bridge.socket, "socket", DeniedSocket)
    with pytest.raises(bridge.BridgeError) as info:
        bridge.connect([path])
    assert str(info.value).startswith(f"permission denied on {path}: this account may not use gpuctld's socket")


def test_ready_line_is_the_same_on_both_ends():
    assert ssh_transport.READY_LINE_PREFIX == bridge.READY_LINE_PREFIX


def test_default_socket_path_rule(monkeypatch):
    monkeypatch.delenv(paths.SOCKET_ENV, raising=False)
    monkeypatch.setattr(paths.os, "geteuid", lambda: 0)
    assert paths.default_socket_path() == "/run/gpuctld/gpuctld.sock"
    assert paths.socket_candidates() == ["/run/gpuctld/gpuctld.sock"]

    monkeypatch.setattr(paths.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(paths.os, "getuid", lambda: 1000)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert paths.default_socket_path() == "/run/user/1000/gpuctld.sock"
    assert paths.socket_candidates() == ["/run/user/1000/gpuctld.sock", "/run/gpuctld/gpuctld.sock"]

    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert paths.default_socket_path() == "/run/user/1000/gpuctld.sock"

    monkeypatch.setenv(paths.SOCKET_ENV, "/tmp/x/g.sock")
    assert paths.default_socket_path() == "/tmp/x/g.sock"


def test_gpuctld_dispatches_bridge(tmp_path):
    """The daemon's own program runs the bridge (`gpuctld bridge ...` as used over SSH)."""
    path = tmp_path / "none.sock"
    done = subprocess.run(
        [sys.executable, "-m", "gpuctl.daemon", "bridge", "--socket", str(path)],
        capture_output=True, timeout=20, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert done.returncode == 2
    assert done.stderr.decode().strip() == f"gpuctld is not running on this node: no socket at {path}"
