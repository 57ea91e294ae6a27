"""SshTransport: reach a node's gpuctld through the node's sshd (paramiko), one SSH connection per node.

The SSH connection is opened on the first request and kept; each HTTP connection is a channel
joined to the daemon's Unix socket on the node, by the first of these that works (remembered per
node): "streamlocal", sshd itself connects the channel to the socket (OpenSSH
direct-streamlocal@openssh.com, gpuctl.transport.streamlocal; ~1 ms on the node); "relay", an exec
channel running a few lines of stdlib Python (``python3 -I -S``, gpuctl.transport.relay; ~15 ms
plus the login shell's start); "bridge", an exec channel running ``gpuctld bridge [--socket PATH]``
(gpuctl.daemon.bridge; imports gpuctl, ~200 ms plus the shell). All three connect as the SSH login
user, so the daemon's SO_PEERCRED audit sees that user. The path used is logged (logger
"gpuctl.transport.ssh", INFO: ``gpuctl -v``). Channels are kept alive and reused by the httpcore
pool (gpuctl.transport.channel_http). A dead SSH connection is re-opened once on the next request.

Host resolution follows ~/.ssh/config like ``ssh -G`` (gpuctl.transport.sshconfig, Include
followed); host keys are checked against known_hosts (gpuctl.transport.knownhosts); keys come from
the ssh-agent and identity files (gpuctl.transport.sshkeys). Every step has the node's timeout_s.
Every failure is a TransportError naming the node and host:port.
"""

from __future__ import annotations

import logging
import os
import shlex
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import paramiko

from gpuctl.transport.channel_http import ChannelHttpTransport
from gpuctl.transport.errors import TransportError, describe_os_error, transport_error
from gpuctl.transport.knownhosts import (
    KnownHosts,
    blob_key_type,
    fingerprint_sha256,
    host_entry_name,
    key_type_label,
)
from gpuctl.transport.local import BASE_URL
from gpuctl.transport.relay import READY_LINE_PREFIX as RELAY_READY_LINE_PREFIX
from gpuctl.transport.relay import relay_command
from gpuctl.transport.streamlocal import KIND as STREAMLOCAL_KIND
from gpuctl.transport.streamlocal import open_streamlocal
from gpuctl.transport.sshconfig import SshConfig, SshConfigError, SshHost, load_config, parse_jump, resolve_host
from gpuctl.transport.sshkeys import KeyLoadError, load_private_key, public_blob

#: known_hosts file of the user, used when no path is given.
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
#: System-wide known_hosts, consulted (read-only) together with the default user file.
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
#: The bridge's line on stderr once it is joined to the socket (gpuctl.daemon.bridge.READY_LINE_PREFIX;
#: repeated here so the transport layer does not import the daemon package; a test keeps them equal).
READY_LINE_PREFIX = "gpuctld bridge: connected to "
#: Seconds between SSH keepalives when the ssh config sets no ServerAliveInterval.
DEFAULT_KEEPALIVE_S = 30
#: Ways to join a channel to the daemon's socket, fastest first (see the module's docstring).
CHANNEL_KINDS = ("streamlocal", "relay", "bridge")
#: Environment variable restricting CHANNEL_KINDS, e.g. "bridge" or "relay,bridge" (benchmarks, odd nodes).
CHANNELS_ENV = "GPUCTL_SSH_CHANNELS"
#: The socket the fast paths use when the node config names none: the system daemon's (the bridge,
#: the last resort, also finds a daemon running under the login user's own runtime dir).
SYSTEM_SOCKET_PATH = "/run/gpuctld/gpuctld.sock"

log = logging.getLogger(__name__)


def channel_kinds_from_env(value: str | None) -> tuple[str, ...]:
    """CHANNEL_KINDS restricted by a comma list (None or "": all). Raises ValueError naming
    CHANNELS_ENV and the unknown word."""
    if not value:
        return CHANNEL_KINDS
    words = tuple(w.strip() for w in value.split(",") if w.strip())
    bad = [w for w in words if w not in CHANNEL_KINDS]
    if bad or not words:
        raise ValueError(f"{CHANNELS_ENV}={value!r}: unknown channel kind {bad[0] if bad else ''!r} "
                         f"(expected a comma list of {', '.join(CHANNEL_KINDS)})")
    return tuple(k for k in CHANNEL_KINDS if k in words)


class _Unavailable(Exception):
    """This way of joining a channel to the socket does not work on this node; try the next one."""


class NodeLike(Protocol):
    """What the transports read from a node config (gpuctl.config.NodeConfig has these)."""

    name: str
    host: str
    user: str | None
    port: int | None
    identity_file: str | None
    socket: str | None
    transport: str
    gpuctld: str
    timeout_s: float


@dataclass(frozen=True)
class CompletedRemote:
    """One command run on the node by :meth:`SshTransport.run`.

    command: the command line as sent (run by the node's login shell). rc: its exit status; None
    when the node gave none (timed out, killed by a signal, or the channel closed first). stdout,
    stderr: everything it wrote (bytes). timed_out: it ran past its timeout_s; gpuctl closed the
    channel (the remote process may still be running).
    """

    command: str
    rc: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool = False


class _QuickAckSocket(socket.socket):
    """A TCP socket that acknowledges what it receives at once (Linux TCP_QUICKACK after each
    recv; elsewhere a plain socket).

    The server's side of a channel close is more than one write; sshd sends the second only once
    the first is acknowledged (Nagle: sshd sets TCP_NODELAY for interactive sessions only), and a
    client that delays its ACK (40 ms on Linux) then delays the answer to the next channel open by
    as much. Quick ACKs remove that wait; TCP_QUICKACK is not sticky, hence once per recv.
    """

    _QUICKACK = getattr(socket, "TCP_QUICKACK", None)

    @classmethod
    def adopt(cls, sock: socket.socket) -> socket.socket:
        """`sock` re-wrapped (same file descriptor and timeout); `sock` itself if the platform
        has no TCP_QUICKACK."""
        if cls._QUICKACK is None:
            return sock
        timeout = sock.gettimeout()
        new = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        new.settimeout(timeout)
        return new

    def recv(self, bufsize: int, flags: int = 0) -> bytes:  # noqa: D102 (socket.recv)
        data = super().recv(bufsize, flags)
        try:
            self.setsockopt(socket.IPPROTO_TCP, self._QUICKACK, 1)
        except OSError:
            pass
        return data


class _StepError(Exception):
    """A failed connection step: message (no node prefix) and TransportError code."""

    def __init__(self, message: str, code: str = "unreachable"):
        super().__init__(message)
        self.message = message
        self.code = code


def bridge_command(gpuctld: str, socket_path: str | None) -> str:
    """The remote command line: ``<gpuctld words> bridge [--socket PATH]``, every word shell-quoted.

    gpuctld: the daemon's command as shell-like words (e.g. "gpuctld" or "sudo -n /opt/gpuctld",
    split with shlex). Raises ValueError for unbalanced quotes.
    """
    words = shlex.split(gpuctld) + ["bridge"]
    if socket_path is not None:
        words += ["--socket", socket_path]
    return shlex.join(words)


def _preferred_key_types(known_types: list[str], offered: tuple[str, ...]) -> tuple[str, ...]:
    """Host key algorithms with those matching known_hosts first (so the check compares like with like)."""
    first: list[str] = []
    for key_type in known_types:
        algorithms = ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"] if key_type == "ssh-rsa" else [key_type]
        first += [a for a in algorithms if a in offered and a not in first]
    return tuple(first + [a for a in offered if a not in first])


class SshTransport:
    """HTTP to a node's gpuctld over SSH.

    node: any object with NodeLike's attributes. ssh_config_path: ssh config (default
    ~/.ssh/config); include_dir: base of relative Includes (default ~/.ssh). known_hosts_path:
    the user's known_hosts (default ~/.ssh/known_hosts, plus /etc/ssh/ssh_known_hosts read-only).
    accept_new_host_key: add an unknown host key to known_hosts (never a changed one).
    passphrase: for encrypted identity files. use_agent: try the ssh-agent ($SSH_AUTH_SOCK).

    channel_kinds: the ways to join a channel to the daemon's socket, tried in this order
    (default: $GPUCTL_SSH_CHANNELS, else CHANNEL_KINDS); the first that works is remembered.

    Nothing touches the network until the first request. Attributes for diagnostics:
    ``connections_opened`` (SSH connections made), ``channels_opened`` (channels to the daemon),
    ``channel_kind`` (the kind of the last one: "streamlocal", "relay", "bridge"; None before),
    ``channel_open_s`` (seconds the last one took to open, node side included).
    """

    def __init__(
        self,
        node: NodeLike,
        *,
        ssh_config_path: str | None = None,
        include_dir: str | None = None,
        known_hosts_path: str | None = None,
        accept_new_host_key: bool = False,
        passphrase: str | None = None,
        use_agent: bool = True,
        channel_kinds: tuple[str, ...] | None = None,
    ):
        self.node = node
        if channel_kinds is None:
            try:
                channel_kinds = channel_kinds_from_env(os.environ.get(CHANNELS_ENV))
            except ValueError as exc:
                raise TransportError(node.name, str(exc), code="config") from exc
        bad = [k for k in channel_kinds if k not in CHANNEL_KINDS]
        if bad or not channel_kinds:
            raise TransportError(node.name, f"unknown channel kinds {bad or channel_kinds!r}", code="config")
        self.channel_kinds = tuple(channel_kinds)
        self.channel_kind: str | None = None
        self.channel_open_s: float | None = None
        self.timeout_s = float(node.timeout_s)
        self._ssh_config_path = ssh_config_path
        self._include_dir = include_dir
        self._known_hosts_path = known_hosts_path
        self._accept_new_host_key = accept_new_host_key
        self._passphrase = passphrase
        self._use_agent = use_agent
        self._lock = threading.RLock()
        self._host: SshHost | None = None
        self._config: SshConfig | None = None
        self._ssh: paramiko.Transport | None = None
        self._hops: list[paramiko.Transport] = []
        self._hop_addresses: list[str] = []
        self._client: httpx.Client | None = None
        self._http: ChannelHttpTransport | None = None
        self.connections_opened = 0
        self.channels_opened = 0

    # ------------------------------------------------------------------ public

    @property
    def address(self) -> str:
        """``host:port`` this node resolves to (the node's host name before resolution succeeds)."""
        return self._host.address if self._host else str(self.node.host)

    @property
    def jump_hosts(self) -> list[str]:
        """``host:port`` of the ProxyJump hops of the open SSH connection, in order ([] when direct)."""
        with self._lock:
            return list(self._hop_addresses) if self._ssh is not None else []

    def resolve(self) -> SshHost:
        """The node's SSH target after ~/.ssh/config and the node's own user/port/identity_file.

        Raises TransportError (code "config") when the ssh config cannot be used.
        """
        if self._host is None:
            try:
                self._config = load_config(self._ssh_config_path, include_dir=self._include_dir)
                self._host = resolve_host(
                    self.node.host,
                    config=self._config,
                    user=self.node.user,
                    port=self.node.port,
                    identity_file=self.node.identity_file,
                )
            except SshConfigError as exc:
                raise TransportError(self.node.name, str(exc), address=self.address, code="config") from exc
        return self._host

    def http_client(self) -> httpx.Client:
        """The node's httpx.Client (base_url "http://gpuctld", keep-alive, timeout timeout_s); the same each call.

        Requests raise TransportError on any failure to reach the daemon.
        """
        with self._lock:
            if self._client is None:
                self._http = ChannelHttpTransport(self._open_bridge_channel, self.error)
                self._client = httpx.Client(transport=self._http, base_url=BASE_URL, timeout=self.timeout_s,
                                            trust_env=False)
            return self._client

    def error(self, exc: BaseException) -> TransportError:
        """`exc` (from a request on this node) as a TransportError naming the node and host:port."""
        return transport_error(self.node.name, exc, address=self.address, timeout_s=self.timeout_s)

    def close(self) -> None:
        """Close the client, its channels and the SSH connection (and jump hosts); safe to call twice."""
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
                self._http = None
            self._drop_ssh()

    def connect(self) -> None:
        """Open the SSH connection now (it is kept for later calls). Raises TransportError."""
        self._ensure_connected()

    def run(self, command: str, *, stdin: bytes | None = None, timeout_s: float | None = None) -> CompletedRemote:
        """Run `command` on the node (an exec channel, no terminal) and collect its output.

        stdin: bytes sent to it, then end-of-file (None: end-of-file at once). timeout_s: seconds
        it may run (default the node's timeout_s); past that the channel is closed and the result
        has timed_out=True. A non-zero exit status is not an error: look at ``rc``. Raises
        TransportError when the node cannot be reached or the connection is lost meanwhile.
        """
        limit = self.timeout_s if timeout_s is None else float(timeout_s)
        channel = self._session()
        out, err = bytearray(), bytearray()
        try:
            self._exec(channel, command)
            deadline = time.monotonic() + limit
            channel.settimeout(max(0.001, limit))
            try:
                if stdin:
                    channel.sendall(stdin)
                channel.shutdown_write()
            except (socket.timeout, OSError, EOFError, paramiko.SSHException):
                pass  # the command stopped reading; its exit status says what happened
            while True:
                while channel.recv_ready():
                    out += channel.recv(65536)
                while channel.recv_stderr_ready():
                    err += channel.recv_stderr(65536)
                done = channel.exit_status_ready() and (channel.eof_received or channel.closed)
                if done and not channel.recv_ready() and not channel.recv_stderr_ready():
                    break
                if time.monotonic() >= deadline:
                    return CompletedRemote(command, None, bytes(out), bytes(err), timed_out=True)
                channel.status_event.wait(0.02)
            status = channel.exit_status
            if status < 0 and (self._ssh is None or not self._ssh.is_active()):
                raise self._fail(f"connection lost while running `{command}`")
            return CompletedRemote(command, status if status >= 0 else None, bytes(out), bytes(err))
        finally:
            channel.close()

    def exec_channel(self, command: str) -> paramiko.Channel:
        """Start `command` on the node on a new exec channel of this connection (no terminal) and
        return the channel; the caller reads it (recv / recv_stderr / exit_status) and closes it.
        Raises TransportError when the node cannot be reached or refuses to run it."""
        channel = self._session()
        try:
            self._exec(channel, command)
        except BaseException:
            channel.close()
            raise
        return channel

    def put_file(self, local_path: str | os.PathLike, remote_path: str, mode: int = 0o644) -> int:
        """Copy the local file to `remote_path` on the node over SFTP, then set its mode; returns
        the bytes written (checked against the remote file's size).

        Raises TransportError when the node cannot be reached, OSError naming the node and path
        when the node refuses (no SFTP subsystem, no such directory, permission denied).
        """
        t = self._ensure_connected()
        where = f"node {self.node.name} ({self.address})"
        try:
            sftp = paramiko.SFTPClient.from_transport(t)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if not t.is_active():
                raise self._fail(f"connection lost opening SFTP: {exc}") from exc
            raise OSError(f"{where}: the SSH server offers no SFTP ({exc or type(exc).__name__}); enable it "
                          "in the node's sshd_config (Subsystem sftp internal-sftp)") from exc
        try:
            sftp.get_channel().settimeout(self.timeout_s)
            try:
                attrs = sftp.put(os.fspath(local_path), remote_path, confirm=True)
                sftp.chmod(remote_path, mode)
            except (socket.timeout, TimeoutError) as exc:
                raise self._fail(f"timed out after {self.timeout_s:g} s writing {remote_path} over SFTP",
                                 "timeout") from exc
            except OSError as exc:
                reason = exc.strerror or str(exc) or type(exc).__name__
                error = OSError(f"{where}: cannot write {remote_path} over SFTP: {reason}")
                error.errno = exc.errno
                raise error from exc
            return int(attrs.st_size or 0)
        finally:
            sftp.close()

    # ------------------------------------------------------------------ connection

    def _fail(self, message: str, code: str = "unreachable") -> TransportError:
        return TransportError(self.node.name, message, address=self.address, code=code)

    def _drop_ssh(self) -> None:
        for t in [self._ssh, *reversed(self._hops)]:
            if t is not None:
                t.close()
        self._ssh = None
        self._hops = []

    def _ensure_connected(self) -> paramiko.Transport:
        with self._lock:
            if self._ssh is not None and self._ssh.is_active():
                return self._ssh
            self._drop_ssh()
            host = self.resolve()
            hops: list[tuple[paramiko.Transport, str]] = []
            try:
                sock = self._first_socket(host, hops)
                self._ssh = self._start_ssh(sock, host)
            except BaseException as exc:
                for t, _ in reversed(hops):
                    t.close()
                if isinstance(exc, _StepError):
                    raise self._fail(exc.message, exc.code) from exc
                raise
            self._hops = [t for t, _ in hops]
            self._hop_addresses = [address for _, address in hops]
            self.connections_opened += 1
            return self._ssh

    def _first_socket(self, host: SshHost, hops: list[tuple[paramiko.Transport, str]]) -> Any:
        """A connected socket-like object to `host`: direct TCP, ProxyCommand, or through its
        ProxyJump hops (each appended to `hops` as (transport, "host:port"); a hop's own ProxyJump
        is not followed)."""
        if host.proxy_jump:
            previous: paramiko.Transport | None = None
            for spec in host.proxy_jump:
                try:
                    user, name, port = parse_jump(spec)
                    jump = resolve_host(name, config=self._config, user=user, port=port)
                except SshConfigError as exc:
                    raise _StepError(f"ProxyJump {spec!r}: {exc}", "config") from exc
                try:
                    sock = self._tcp(jump) if previous is None else self._direct_tcpip(previous, jump)
                    previous = self._start_ssh(sock, jump)
                except _StepError as exc:
                    raise _StepError(f"jump host {jump.alias} ({jump.address}): {exc.message}", exc.code) from exc
                hops.append((previous, jump.address))
            return self._direct_tcpip(previous, host)
        if host.proxy_command:
            try:
                return paramiko.ProxyCommand(host.proxy_command)
            except (OSError, paramiko.SSHException) as exc:
                raise _StepError(f"ProxyCommand {host.proxy_command!r} failed: {exc}") from exc
        return self._tcp(host)

    def _tcp(self, host: SshHost) -> socket.socket:
        timeout = host.connect_timeout_s or self.timeout_s
        try:
            sock = socket.create_connection((host.hostname, host.port), timeout=timeout)
        except (socket.timeout, TimeoutError) as exc:
            raise _StepError(f"timed out after {timeout:g} s connecting", "timeout") from exc
        except OSError as exc:
            raise _StepError(describe_os_error(exc)) from exc
        # Requests and channel opens are small writes that wait for an answer: without
        # TCP_NODELAY, Nagle holds one behind the peer's delayed ACK (40 ms on Linux) whenever
        # the previous write is still unacknowledged (e.g. a channel close right before an open).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _QuickAckSocket.adopt(sock)

    def _direct_tcpip(self, via: paramiko.Transport, host: SshHost) -> paramiko.Channel:
        try:
            return via.open_channel(
                "direct-tcpip", (host.hostname, host.port), ("127.0.0.1", 0), timeout=self.timeout_s
            )
        except paramiko.ChannelException as exc:
            raise _StepError(f"the jump host could not reach {host.address}: {exc.text}") from exc
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise _StepError(f"the jump host could not open a channel to {host.address}: {exc}") from exc

    def _start_ssh(self, sock: Any, host: SshHost) -> paramiko.Transport:
        """SSH handshake, host key check and authentication over `sock`; closes it on failure."""
        t = paramiko.Transport(sock)
        t.banner_timeout = self.timeout_s
        t.handshake_timeout = self.timeout_s
        t.auth_timeout = self.timeout_s
        try:
            known = self._known_hosts()
            name = host.host_key_alias or host_entry_name(host.hostname, host.port)
            options = t.get_security_options()
            options.key_types = _preferred_key_types(known.known_key_types(name), tuple(options.key_types))
            started = time.monotonic()
            try:
                t.start_client(timeout=self.timeout_s)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                cause = exc.__cause__ or exc.__context__
                text = str(exc)
                # a server that said nothing for the whole timeout timed out, whichever of
                # paramiko's threads noticed first and however it words it (under load its
                # banner reader can end with an empty EOFError/timeout after the deadline)
                waited = time.monotonic() - started >= self.timeout_s * 0.95
                if waited or isinstance(cause, (socket.timeout, TimeoutError)) or "timed out" in text.lower() \
                        or "timeout" in text.lower():
                    raise _StepError(f"timed out after {self.timeout_s:g} s waiting for the SSH server", "timeout") from exc
                if "banner" in text.lower():
                    raise _StepError(f"no SSH server answered ({text})") from exc
                raise _StepError(f"SSH handshake failed: {text or type(exc).__name__}") from exc
            if not t.is_active() or not t.initial_kex_done:
                # start_client returns quietly when its timeout passes before the key exchange ends
                raise _StepError(f"timed out after {self.timeout_s:g} s waiting for the SSH server", "timeout")
            self._check_host_key(t, host, known, name)
            self._authenticate(t, host)
            t.set_keepalive(int(host.server_alive_interval_s or DEFAULT_KEEPALIVE_S))
            return t
        except BaseException:
            t.close()
            raise

    # ------------------------------------------------------------------ host keys

    def _known_hosts(self) -> KnownHosts:
        """The known_hosts files' lines. Raises TransportError (code "config") naming the file when
        one exists but cannot be read (a directory, no permission): never a bare "is a directory"."""
        try:
            if self._known_hosts_path is not None:
                return KnownHosts(self._known_hosts_path)
            return KnownHosts(DEFAULT_KNOWN_HOSTS, (SYSTEM_KNOWN_HOSTS,))
        except OSError as exc:
            path = exc.filename or self._known_hosts_path or DEFAULT_KNOWN_HOSTS
            raise TransportError(self.node.name, f"known_hosts file {path} cannot be read: {exc.strerror or exc}",
                                 address=self.address, code="config") from exc

    def _check_host_key(self, t: paramiko.Transport, host: SshHost, known: KnownHosts, name: str) -> None:
        key = t.get_remote_server_key()
        blob = key.asbytes()
        key_type = blob_key_type(blob)
        fingerprint = fingerprint_sha256(blob)
        label = key_type_label(key_type)
        result = known.check(name, blob)
        if result.status == "ok":
            return
        if result.status == "revoked":
            raise _StepError(
                f"the host key of {host.address} ({label} {fingerprint}) is REVOKED in {result.line.where}: refusing to connect",
                "host_key_changed",
            )
        if result.status == "changed":
            raise _StepError(
                f"HOST KEY FOR {host.address} HAS CHANGED: it is now {label} {fingerprint}, not the key in "
                f"{result.line.where}; possible man-in-the-middle; remove the old key from {result.line.where} "
                f"if the change is expected (ssh-keygen -R '{name}' -f {result.line.path})",
                "host_key_changed",
            )
        if result.other_types:
            # The host is known, by keys of other types: a server offering only a type we do not hold
            # is what a man-in-the-middle does, so even --accept-new-host-key refuses (as a change).
            where = ", ".join(ln.where for ln in known.for_host(name) if ln.marker is None)
            raise _StepError(
                f"host key of {host.address} is {label} {fingerprint}, but {where} holds only keys of other types "
                f"for it ({', '.join(result.other_types)}); possible man-in-the-middle; refusing to connect "
                f"(add the {label} key by hand after checking it with the node's admin)",
                "host_key_changed",
            )
        if self._accept_new_host_key:
            try:
                known.add(name, key_type, blob)
            except OSError as exc:
                raise _StepError(f"cannot add the host key to {known.path}: {exc.strerror}", "config") from exc
            return
        raise _StepError(
            f"host key is not known: {label} key fingerprint is {fingerprint}; check it with the "
            f"node's admin (ssh-keygen -lf /etc/ssh/ssh_host_{label.lower()}_key.pub on the node), then run "
            f"again with --accept-new-host-key to add it to {known.path}",
            "host_key_unknown",
        )

    # ------------------------------------------------------------------ authentication

    def _authenticate(self, t: paramiko.Transport, host: SshHost) -> None:
        agent = paramiko.Agent() if self._use_agent else None
        try:
            agent_keys = list(agent.get_keys()) if agent else []
        except paramiko.SSHException:
            agent_keys = []
        try:
            candidates: list[tuple[str, paramiko.PKey]] = []
            problems: list[KeyLoadError] = []
            used: set[bytes] = set()
            for path in host.identity_files:
                if not host.identity_files_given and not os.path.exists(path):
                    continue
                blob = public_blob(path)
                in_agent = [k for k in agent_keys if blob is not None and k.asbytes() == blob]
                if in_agent:
                    candidates.append((f"{path} (agent)", in_agent[0]))
                    used.add(in_agent[0].asbytes())
                    continue
                try:
                    key = load_private_key(path, self._passphrase)
                except KeyLoadError as exc:
                    problems.append(exc)
                    continue
                candidates.append((path, key))
                used.add(key.asbytes())
            if not host.identities_only:
                for k in agent_keys:
                    if k.asbytes() not in used:
                        comment = getattr(k, "comment", "") or ""
                        candidates.append((f"agent key {fingerprint_sha256(k.asbytes())} {comment}".strip(), k))
            tried: list[str] = []
            for label, key in candidates:
                try:
                    t.auth_publickey(host.user, key)
                except paramiko.BadAuthenticationType as exc:
                    raise _StepError(
                        f"authentication failed: the server does not accept keys for user {host.user} "
                        f"(it allows: {', '.join(exc.allowed_types) or 'nothing'})",
                        "auth",
                    ) from exc
                except paramiko.AuthenticationException as exc:
                    if "timeout" in str(exc).lower():
                        raise _StepError(f"timed out after {self.timeout_s:g} s authenticating", "timeout") from exc
                    tried.append(label)
                    continue
                except (paramiko.SSHException, EOFError, OSError) as exc:
                    if not t.is_active():
                        raise _StepError(f"connection lost while authenticating: {exc}") from exc
                    tried.append(f"{label} ({exc})")
                    continue
                if t.is_authenticated():
                    return
            key_problems = "; ".join(str(p) for p in problems)
            if not tried and problems:
                raise _StepError(f"{key_problems} (authentication failed for user {host.user}: no other key to try)", "key")
            tried_text = ", ".join(tried) if tried else "none: no agent keys and no identity files"
            message = f"authentication failed for user {host.user} (tried keys: {tried_text})"
            raise _StepError(f"{message}; {key_problems}" if problems else message, "auth")
        finally:
            if agent is not None:
                agent.close()

    # ------------------------------------------------------------------ the bridge channel

    def _session(self) -> paramiko.Channel:
        """A new session channel; a dead SSH connection is re-opened once. Raises TransportError."""
        for attempt in (1, 2):
            t = self._ensure_connected()
            try:
                return t.open_session(timeout=self.timeout_s)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                with self._lock:
                    if self._ssh is t:
                        self._drop_ssh()
                if attempt == 2:
                    raise self._fail(f"cannot open an SSH channel: {exc or type(exc).__name__}") from exc
        raise AssertionError("unreachable")

    def _open_bridge_channel(self, timeout: float | None = None) -> paramiko.Channel:
        """A new channel joined to the daemon's socket: the remembered kind first, then the others
        in order (see the module's docstring). Raises TransportError (the bridge's error when every
        kind failed)."""
        kinds = list(self.channel_kinds)
        if self.channel_kind in kinds:
            kinds.remove(self.channel_kind)
            kinds.insert(0, self.channel_kind)
        self._ensure_connected()  # the handshake is not the channel's cost: time the channel alone
        for i, kind in enumerate(kinds):
            t0 = time.monotonic()
            try:
                if kind == "streamlocal":
                    channel = self._open_streamlocal_channel()
                elif kind == "relay":
                    channel = self._open_relay_channel()
                else:
                    channel = self._open_gpuctld_bridge_channel()
            except _Unavailable as exc:
                rest = kinds[i + 1:]
                if not rest:
                    raise self._fail(str(exc), "daemon") from exc
                log.info("node %s (%s): control channel: %s unavailable (%s); trying %s",
                         self.node.name, self.address, kind, exc, rest[0])
                continue
            elapsed = time.monotonic() - t0
            if kind != self.channel_kind:
                log.info("node %s (%s): control channel: %s (%s), opened in %.1f ms",
                         self.node.name, self.address, kind, self._describe_kind(kind), elapsed * 1000)
            self.channel_kind, self.channel_open_s = kind, elapsed
            self.channels_opened += 1
            return channel
        raise AssertionError("unreachable")

    def _fast_socket(self) -> str:
        return self.node.socket or SYSTEM_SOCKET_PATH

    def _describe_kind(self, kind: str) -> str:
        if kind == "streamlocal":
            return f"{STREAMLOCAL_KIND} to {self._fast_socket()}"
        if kind == "relay":
            return f"python3 -I -S relay to {self._fast_socket()}"
        return f"`{self.node.gpuctld} bridge`"

    def _open_streamlocal_channel(self) -> paramiko.Channel:
        t = self._ensure_connected()
        try:
            return open_streamlocal(t, self._fast_socket(), self.timeout_s)
        except paramiko.ChannelException as exc:
            # OpenSSH answers "connect failed" both when its config or the key forbids stream-local
            # forwarding and when nothing listens at the path
            raise _Unavailable(f"sshd did not join a {STREAMLOCAL_KIND} channel to {self._fast_socket()}: "
                               f"{exc.text or exc.code} (forwarding off in sshd_config or for the key, "
                               "or nothing listens there)") from exc
        except (paramiko.SSHException, EOFError, OSError) as exc:
            with self._lock:
                if self._ssh is t and not t.is_active():
                    self._drop_ssh()
            raise _Unavailable(f"{STREAMLOCAL_KIND} failed: {exc or type(exc).__name__}") from exc

    def _open_relay_channel(self) -> paramiko.Channel:
        command = relay_command(self._fast_socket())
        channel = self._session()
        try:
            self._exec(channel, command)
            ok, stderr = self._wait_line(channel, "python3 -I -S relay", RELAY_READY_LINE_PREFIX.encode())
        except BaseException:
            channel.close()
            raise
        if not ok:
            channel.close()
            lines = [ln.strip() for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
            raise _Unavailable(lines[-1] if lines else "the relay exited without a word")
        return channel

    def _open_gpuctld_bridge_channel(self) -> paramiko.Channel:
        try:
            command = bridge_command(self.node.gpuctld, self.node.socket)
        except ValueError as exc:
            raise self._fail(f"gpuctld command {self.node.gpuctld!r} is not valid: {exc}", "config") from exc
        channel = self._session()
        try:
            self._exec(channel, command)
            self._wait_ready(channel, command)
        except BaseException:
            channel.close()
            raise
        return channel

    def _exec(self, channel: paramiko.Channel, command: str) -> None:
        # paramiko's exec_command waits for the server's reply without a timeout: close the
        # channel after timeout_s to end the wait.
        timer = threading.Timer(self.timeout_s, channel.close)
        timer.daemon = True
        timer.start()
        try:
            channel.exec_command(command)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if channel.closed:
                raise self._fail(f"timed out after {self.timeout_s:g} s starting `{command}`", "timeout") from exc
            raise self._fail(f"the node refused to run `{command}`: {exc}", "daemon") from exc
        finally:
            timer.cancel()

    def _wait_line(self, channel: paramiko.Channel, what: str, ready: bytes) -> tuple[bool, bytes]:
        """Read the channel's stderr until `ready` appears: (True, stderr), or (False, stderr) when
        stderr ended first. Raises TransportError (timeout) after timeout_s."""
        deadline = time.monotonic() + self.timeout_s
        stderr = b""
        while ready not in stderr:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._fail(f"timed out after {self.timeout_s:g} s waiting for `{what}` to start", "timeout")
            channel.settimeout(remaining)
            try:
                data = channel.recv_stderr(4096)
            except socket.timeout:
                continue
            if not data:
                return False, stderr
            stderr += data
        channel.settimeout(None)
        return True, stderr

    def _wait_ready(self, channel: paramiko.Channel, command: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        ok, stderr = self._wait_line(channel, command, READY_LINE_PREFIX.encode())
        if not ok:
            raise self._bridge_failed(channel, command, stderr, deadline)

    def _bridge_failed(self, channel: paramiko.Channel, command: str, stderr: bytes, deadline: float) -> TransportError:
        channel.status_event.wait(max(0.0, deadline - time.monotonic()))
        status = channel.exit_status if channel.exit_status_ready() else None
        lines = [ln.strip() for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
        for line in lines:
            if "gpuctld is not running on this node" in line or line.startswith("permission denied on"):
                return self._fail(line, "daemon")
        program = shlex.split(self.node.gpuctld)[0] if self.node.gpuctld.strip() else "gpuctld"
        if status == 127 or any("not found" in ln or "No such file" in ln for ln in lines):
            return self._fail(
                f"gpuctld is not installed on this node ({program!r} not found): install it "
                "(gpuctl node bootstrap) or set gpuctld = PATH for this node in the fleet config",
                "daemon",
            )
        last = lines[-1] if lines else "no message"
        how = f"exit status {status}" if status is not None else "no exit status"
        return self._fail(f"`{command}` failed ({how}): {last}", "daemon")
