"""The SSH connection cache (opt-in): one per-user background process holding the fleet's SSH
connections, so repeated CLI commands do not pay the SSH handshake each time (in the spirit of
OpenSSH's ControlMaster/ControlPersist).

Turned on by ``GPUCTL_SSH_CACHE=1`` (or any idle time in seconds, e.g. ``GPUCTL_SSH_CACHE=1800``;
"1" means :data:`DEFAULT_IDLE_S`). Then :func:`gpuctl.transport.open_transport` gives a
:class:`CachedSshTransport` for SSH nodes: each HTTP connection is a Unix-socket connection to the
cache (started on first use: ``python -m gpuctl.transport.conncache serve``), which opens the
channel to the node's daemon on its kept connection (gpuctl.transport.ssh.SshTransport: the same
ssh config, known_hosts, host-key and key rules, with the options the client sent) and then copies
bytes both ways.

Socket: ``$XDG_RUNTIME_DIR/gpuctl/ssh-cache.sock`` (else ``/tmp/gpuctl-<uid>/ssh-cache.sock``), in
a 0700 directory, mode 0600; the cache also refuses any peer whose SO_PEERCRED uid is not its own.
It exits, removing the socket, after ``idle_s`` seconds with no connection open.

Protocol on each cache connection: the client sends one JSON line ``{"node": {NodeLike fields},
"options": {ssh_config_path, known_hosts_path, include_dir, use_agent}}`` (or ``{"stats": true}``);
the cache answers one JSON line, ``{"ok": true, "kind": "streamlocal"|"relay"|"bridge"}`` then the
raw channel, or ``{"ok": false, "node", "message", "address", "code"}`` (a TransportError) and
closes. Stats: ``{"transports": n, "connections_opened": n, "channels_opened": n, "pid": n}``.
Limits: a key with a passphrase is usable only through the ssh-agent the cache started with;
``--accept-new-host-key`` is not passed through (unknown host keys are refused as without it).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import select
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from gpuctl.transport.channel_http import ChannelHttpTransport
from gpuctl.transport.errors import TransportError, transport_error
from gpuctl.transport.local import BASE_URL

#: Environment variable turning the cache on ("1", or the idle time in seconds).
CACHE_ENV = "GPUCTL_SSH_CACHE"
#: Seconds the cache stays up with no connection open, unless CACHE_ENV names another figure.
DEFAULT_IDLE_S = 600.0
_NODE_FIELDS = ("name", "host", "user", "port", "identity_file", "socket", "transport", "gpuctld", "timeout_s")
_OPTION_FIELDS = ("ssh_config_path", "known_hosts_path", "include_dir", "use_agent")
_LINE_LIMIT = 64 * 1024

log = logging.getLogger(__name__)


def cache_idle_s(value: str | None = None) -> float | None:
    """The cache's idle time from CACHE_ENV (or `value`): None when the cache is off ("" or "0").
    Raises ValueError naming the variable for anything but a number >= 0."""
    value = os.environ.get(CACHE_ENV, "") if value is None else value
    if value.strip() in ("", "0"):
        return None
    try:
        figure = float(value)
    except ValueError:
        raise ValueError(f"{CACHE_ENV}={value!r}: expected 1 (on) or the idle time in seconds") from None
    if not figure >= 0:
        raise ValueError(f"{CACHE_ENV}={value!r}: expected 1 (on) or the idle time in seconds")
    return DEFAULT_IDLE_S if figure == 1 else figure


def cache_socket_path() -> str:
    """Where this user's cache listens: $XDG_RUNTIME_DIR/gpuctl/ssh-cache.sock, else
    /tmp/gpuctl-<uid>/ssh-cache.sock."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "gpuctl" if runtime and os.path.isdir(runtime) else Path(f"/tmp/gpuctl-{os.getuid()}")
    return str(base / "ssh-cache.sock")


def _read_line(sock: socket.socket, timeout_s: float) -> bytes:
    sock.settimeout(timeout_s)
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError("the other side closed before a whole line")
        data += chunk
        if len(data) > _LINE_LIMIT:
            raise ValueError("line too long")
    return data


# --------------------------------------------------------------------------- the cache process


class _NodeSpec:
    def __init__(self, fields: dict[str, Any]):
        for name in _NODE_FIELDS:
            setattr(self, name, fields.get(name))
        self.timeout_s = float(self.timeout_s or 5.0)
        self.transport = "ssh"
        self.gpuctld = self.gpuctld or "gpuctld"


class CacheServer:
    """The cache: SshTransports by (node, options), one thread per client connection.

    path: the socket; idle_s: exit after that long with no connection open.
    """

    def __init__(self, path: str, idle_s: float):
        self.path = path
        self.idle_s = idle_s
        self._transports: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._active = 0
        self._last_activity = time.monotonic()
        self._stop = threading.Event()

    def _transport(self, node: dict[str, Any], options: dict[str, Any]) -> Any:
        from gpuctl.transport.ssh import SshTransport

        key = json.dumps([node, options], sort_keys=True)
        with self._lock:
            t = self._transports.get(key)
            if t is None:
                t = self._transports[key] = SshTransport(
                    _NodeSpec(node),
                    ssh_config_path=options.get("ssh_config_path"),
                    known_hosts_path=options.get("known_hosts_path"),
                    include_dir=options.get("include_dir"),
                    use_agent=bool(options.get("use_agent", True)),
                )
            return t

    def stats(self) -> dict[str, Any]:
        """Counts over the transports held: for tests, benchmarks and `{"stats": true}`."""
        with self._lock:
            ts = list(self._transports.values())
        return {"transports": len(ts), "connections_opened": sum(t.connections_opened for t in ts),
                "channels_opened": sum(t.channels_opened for t in ts), "pid": os.getpid()}

    def _serve_one(self, conn: socket.socket) -> None:
        try:
            raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _, uid, _ = struct.unpack("3i", raw)
            if uid != os.getuid():
                return
            request = json.loads(_read_line(conn, 10.0))
            if request.get("stats"):
                conn.sendall(json.dumps(self.stats()).encode() + b"\n")
                return
            node = {k: request["node"].get(k) for k in _NODE_FIELDS}
            options = {k: request.get("options", {}).get(k) for k in _OPTION_FIELDS}
            t = self._transport(node, options)
            try:
                channel = t._open_bridge_channel()
            except TransportError as exc:
                conn.sendall(json.dumps({"ok": False, "node": exc.node, "message": exc.message,
                                         "address": exc.address, "code": exc.code}).encode() + b"\n")
                return
            try:
                conn.sendall(json.dumps({"ok": True, "kind": t.channel_kind}).encode() + b"\n")
                conn.settimeout(None)
                _relay(conn, channel)
            finally:
                channel.close()
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return
        finally:
            conn.close()
            with self._lock:
                self._active -= 1
                self._last_activity = time.monotonic()

    def serve(self) -> None:
        """Listen until idle_s passes with no connection open; then remove the socket and close
        every SSH connection."""
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        os.chmod(os.path.dirname(self.path), 0o700)
        if _listening(self.path):
            return  # another cache already serves this socket: leave it be
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            listener.bind(self.path)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        listener.listen(128)
        listener.settimeout(0.2)
        try:
            while True:
                try:
                    conn, _ = listener.accept()
                except socket.timeout:
                    with self._lock:
                        idle = self._active == 0 and time.monotonic() - self._last_activity >= self.idle_s
                    if idle:
                        return
                    continue
                with self._lock:
                    self._active += 1
                    self._last_activity = time.monotonic()
                threading.Thread(target=self._serve_one, args=(conn,), daemon=True).start()
        finally:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            listener.close()
            with self._lock:
                for t in self._transports.values():
                    t.close()


def _relay(conn: socket.socket, channel: Any) -> None:
    """Copy bytes between a client socket and an SSH channel until either side ends.

    epoll (selectors), not select(): the cache holds hundreds of SSH sockets and channel pipes, and
    select() fails for descriptors >= 1024 (a node's relay at 256 nodes ended at once that way)."""
    sel = selectors.DefaultSelector()
    sel.register(conn, selectors.EVENT_READ, "conn")
    sel.register(channel, selectors.EVENT_READ, "channel")
    try:
        while True:
            events = sel.select(60.0)
            if not events and channel.closed:
                return
            for key, _ in events:
                if key.data == "conn":
                    data = conn.recv(65536)
                    if not data:
                        return  # the client closed its connection (HTTP clients close, never half-close)
                    channel.sendall(data)
                else:
                    data = channel.recv(65536)
                    if not data:
                        return
                    conn.sendall(data)
    finally:
        sel.close()


def _listening(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
            return True
        except OSError:
            return False


_start_lock = threading.Lock()


def start_cache(path: str, idle_s: float, timeout_s: float = 10.0) -> None:
    """Start the cache process in the background (its own session) and wait until it listens.

    One start at a time: a thread lock in this process and an flock on ``<dir>/ssh-cache.lock``
    across processes; whoever gets it second finds the cache listening and starts nothing."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with _start_lock, open(os.path.join(os.path.dirname(path), "ssh-cache.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _listening(path):
            _spawn_and_wait(path, idle_s, timeout_s)


def _spawn_and_wait(path: str, idle_s: float, timeout_s: float) -> None:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    subprocess.Popen([sys.executable, "-m", "gpuctl.transport.conncache", "serve", "--socket", path,
                      "--idle-s", str(idle_s)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True, env=env, close_fds=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(path)
                return
        except OSError:
            time.sleep(0.02)
    raise OSError(f"the SSH connection cache did not start listening on {path} within {timeout_s:g} s")


def cache_stats(path: str | None = None) -> dict[str, Any]:
    """The running cache's stats (see the module doc). Raises OSError when no cache listens."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5.0)
        s.connect(path or cache_socket_path())
        s.sendall(b'{"stats": true}\n')
        return json.loads(_read_line(s, 5.0))


# --------------------------------------------------------------------------- the client side


class _SocketChannel:
    """A connected Unix socket with the few Channel methods ChannelStream uses."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self.closed = False
        self.eof_received = False

    def recv(self, n: int) -> bytes:
        data = self._sock.recv(n)
        if not data:
            self.eof_received = True
        return data

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(data)

    def settimeout(self, timeout: float | None) -> None:
        self._sock.settimeout(timeout)

    def recv_ready(self) -> bool:
        poller = select.poll()  # not select(): descriptors may be >= 1024 in a large fleet
        poller.register(self._sock, select.POLLIN)
        return bool(poller.poll(0))

    def exit_status_ready(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
        self._sock.close()


class CachedSshTransport:
    """An SSH node reached through this user's connection cache (same interface as LocalTransport:
    http_client(), error(exc), close()). node: NodeLike; the options are SshTransport's."""

    def __init__(self, node: Any, *, idle_s: float, ssh_config_path: str | None = None,
                 known_hosts_path: str | None = None, include_dir: str | None = None, use_agent: bool = True,
                 socket_path: str | None = None):
        self.node = node
        self.timeout_s = float(node.timeout_s)
        self.idle_s = idle_s
        self.socket_path = socket_path or cache_socket_path()
        self.channel_kind: str | None = None
        self._options = {"ssh_config_path": ssh_config_path, "known_hosts_path": known_hosts_path,
                         "include_dir": include_dir, "use_agent": use_agent}
        self._client: httpx.Client | None = None
        self.address = str(node.host)

    def _connect(self) -> socket.socket:
        for attempt in (1, 2):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.socket_path)
                return s
            except OSError:
                s.close()
                if attempt == 2:
                    raise
                start_cache(self.socket_path, self.idle_s)
        raise AssertionError("unreachable")

    def _open_channel(self, timeout: float | None = None) -> _SocketChannel:
        try:
            s = self._connect()
        except OSError as exc:
            raise TransportError(self.node.name, f"SSH connection cache at {self.socket_path}: {exc}",
                                 address=self.address) from exc
        try:
            node = {k: getattr(self.node, k, None) for k in _NODE_FIELDS}
            s.sendall(json.dumps({"node": node, "options": self._options}).encode() + b"\n")
            # the cache may connect (handshake, auth) and open the channel: up to ~3 timeouts
            answer = json.loads(_read_line(s, 3 * self.timeout_s + 1))
        except (OSError, ValueError) as exc:
            s.close()
            raise TransportError(self.node.name, f"SSH connection cache at {self.socket_path}: {exc}",
                                 address=self.address, code="timeout" if isinstance(exc, TimeoutError) else
                                 "unreachable") from exc
        if not answer.get("ok"):
            s.close()
            self.address = answer.get("address") or self.address
            raise TransportError(answer.get("node") or self.node.name, answer.get("message", "?"),
                                 address=answer.get("address"), code=answer.get("code") or "unreachable")
        if answer.get("kind") != self.channel_kind:
            log.info("node %s: control channel: %s, through the SSH connection cache %s",
                     self.node.name, answer.get("kind"), self.socket_path)
        self.channel_kind = answer.get("kind")
        s.settimeout(None)
        return _SocketChannel(s)

    def http_client(self) -> httpx.Client:
        """The node's httpx.Client (base_url "http://gpuctld"); channels come from the cache."""
        if self._client is None:
            self._client = httpx.Client(transport=ChannelHttpTransport(self._open_channel, self.error),
                                        base_url=BASE_URL, timeout=self.timeout_s, trust_env=False)
        return self._client

    def error(self, exc: BaseException) -> TransportError:
        """`exc` as a TransportError naming the node."""
        return transport_error(self.node.name, exc, address=self.address, timeout_s=self.timeout_s)

    def close(self) -> None:
        """Close this client's connections to the cache (the cache keeps the SSH connection)."""
        if self._client is not None:
            self._client.close()
            self._client = None


def main(argv: list[str] | None = None) -> int:
    """``python -m gpuctl.transport.conncache serve [--socket PATH] [--idle-s S]`` (or ``stats``)."""
    p = argparse.ArgumentParser(prog="python -m gpuctl.transport.conncache")
    p.add_argument("what", choices=("serve", "stats"))
    p.add_argument("--socket", default=None)
    p.add_argument("--idle-s", type=float, default=DEFAULT_IDLE_S)
    a = p.parse_args(argv)
    path = a.socket or cache_socket_path()
    if a.what == "stats":
        print(json.dumps(cache_stats(path)))
        return 0
    CacheServer(path, a.idle_s).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
