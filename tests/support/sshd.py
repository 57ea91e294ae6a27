"""A real OpenSSH sshd on 127.0.0.1 for tests: generated keys, temporary known_hosts and ssh config.

Usage::

    with SshServer(session_env={"PYTHONPATH": REPO}) as server:
        server.port, server.user, server.user_key, server.known_hosts, server.ssh_config

Works as root (PermitRootLogin prohibit-password) and as an ordinary user (who can then log in
only as themselves). StrictModes no, UsePAM no, key authentication only. Everything lives in one
temporary directory removed on exit; sshd is stopped (SIGTERM, then SIGKILL) however the block
ends. Needs /usr/sbin/sshd and ssh-keygen.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

@dataclass(frozen=True)
class Node:
    """Stand-in with NodeConfig's attributes (the transports duck-type it)."""

    name: str
    host: str
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    socket: str | None = None
    transport: str = "ssh"
    gpuctld: str = f"{sys.executable} -m gpuctl.daemon"
    timeout_s: float = 5.0


SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"


def sshd_available() -> bool:
    """True when sshd and ssh-keygen exist (tests skip otherwise)."""
    return os.path.exists(SSHD) and os.path.exists(SSH_KEYGEN)


def keygen(path: Path, *, passphrase: str = "", cipher: str | None = None, key_type: str = "ed25519",
           extra: tuple[str, ...] = ()) -> Path:
    """Generate a key pair at `path` (and path.pub) with ssh-keygen; returns `path`.

    cipher: ssh-keygen -Z value (e.g. "aes256-gcm@openssh.com") for an encrypted key. extra: more
    ssh-keygen options (e.g. ("-m", "PEM", "-b", "1024")).
    """
    cmd = [SSH_KEYGEN, "-q", "-t", key_type, "-N", passphrase, "-C", f"gpuctl-test-{path.name}", "-f", str(path)]
    if cipher:
        cmd += ["-Z", cipher]
    cmd += list(extra)
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SshServer:
    """One sshd process on 127.0.0.1:port with its own keys; a context manager.

    Attributes once started: port, user (the login name: the current user), dir (temporary
    directory), host_key / host_pub (Path), user_key (Path, unencrypted ed25519, authorized),
    authorized_keys, known_hosts (holds "[127.0.0.1]:port" and the host key), ssh_config (Host
    "test-sshd" with HostName, Port, User, IdentityFile, IdentitiesOnly, UserKnownHostsFile),
    log (Path of sshd's stderr).
    session_env: variables set in every session (sshd's SetEnv), e.g. PYTHONPATH.
    extra_config: more sshd_config lines (e.g. "AllowStreamLocalForwarding no\n").
    """

    def __init__(self, session_env: dict[str, str] | None = None, start_timeout_s: float = 10.0,
                 extra_config: str = ""):
        self.session_env = dict(session_env or {})
        self.extra_config = extra_config
        self.start_timeout_s = start_timeout_s
        self.user = getpass.getuser()
        self.proc: subprocess.Popen | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None

    def __enter__(self) -> "SshServer":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def host_key_line(self) -> str:
        """The known_hosts line for this server: ``[127.0.0.1]:port ssh-ed25519 AAAA...``."""
        key_type, key_b64 = self.host_pub.read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {key_type} {key_b64}\n"

    def authorize(self, pub_path: Path) -> None:
        """Add the public key at `pub_path` to authorized_keys."""
        with open(self.authorized_keys, "a") as f:
            f.write(pub_path.read_text())

    def start(self) -> None:
        """Generate keys and config, start sshd and wait until it answers with its banner."""
        if os.geteuid() == 0 and not os.path.isdir("/run/sshd"):
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self._tmp = tempfile.TemporaryDirectory(prefix="gpuctl-sshd-")
        self.dir = Path(self._tmp.name)
        self.host_key = keygen(self.dir / "ssh_host_ed25519_key")
        self.host_pub = self.dir / "ssh_host_ed25519_key.pub"
        self.user_key = keygen(self.dir / "id_user")
        self.authorized_keys = self.dir / "authorized_keys"
        self.authorized_keys.write_text((self.dir / "id_user.pub").read_text())
        self.log = self.dir / "sshd.log"
        last_error = ""
        for _ in range(3):  # another process may take the port between free_port() and bind
            self.port = free_port()
            self._write_configs()
            with open(self.log, "wb") as log:
                self.proc = subprocess.Popen(
                    [SSHD, "-D", "-e", "-f", str(self.dir / "sshd_config")],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )
            if self._wait_banner():
                return
            last_error = self.log.read_text(errors="replace")
            self._stop_proc()
        raise RuntimeError(f"sshd did not start; its log:\n{last_error}")

    def _write_configs(self) -> None:
        setenv = ""
        if self.session_env:
            setenv = "SetEnv " + " ".join(f'"{k}={v}"' for k, v in self.session_env.items()) + "\n"
        (self.dir / "sshd_config").write_text(
            f"Port {self.port}\n"
            "ListenAddress 127.0.0.1\n"
            f"HostKey {self.host_key}\n"
            f"PidFile {self.dir / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {self.authorized_keys}\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\n"
            "StrictModes no\n"
            "UsePAM no\n"
            "AllowTcpForwarding yes\n"
            "PrintMotd no\n"
            "LogLevel VERBOSE\n"
            f"{setenv}"
            f"{self.extra_config}"
        )
        self.known_hosts = self.dir / "known_hosts"
        self.known_hosts.write_text(self.host_key_line())
        self.ssh_config = self.dir / "ssh_config"
        self.ssh_config.write_text(
            "Host test-sshd\n"
            "  HostName 127.0.0.1\n"
            f"  Port {self.port}\n"
            f"  User {self.user}\n"
            f"  IdentityFile {self.user_key}\n"
            "  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.known_hosts}\n"
            "  StrictHostKeyChecking yes\n"
        )

    def _wait_banner(self) -> bool:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                    if s.recv(64).startswith(b"SSH-"):
                        return True
            except OSError:
                time.sleep(0.05)
        return False

    def _stop_proc(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def stop(self) -> None:
        """Stop sshd (and its sessions) and remove the temporary directory; safe to call twice."""
        self._stop_proc()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
