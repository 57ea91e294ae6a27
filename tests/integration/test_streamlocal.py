"""Issue 15 item 2: the node side of a command without starting gpuctld bridge.

Against a REAL OpenSSH sshd on 127.0.0.1 and real gpuctld processes: the hand-made
direct-streamlocal@openssh.com channel open (gpuctl.transport.streamlocal) is pinned here; sshd
refusing it (AllowStreamLocalForwarding no) falls back to the python3 -I -S relay, then to the
bridge; the daemon's peer audit sees the SSH login user (uid, and sshd's own session process as
the peer); `gpuctl -v` names the path.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import paramiko
import pytest

from daemon_proc import REPO_ROOT, DaemonProc, start_daemon
from fleet_fixtures import run_cli
from sshd import Node, SshServer, sshd_available

from gpuctl.transport import TransportError, open_transport
from gpuctl.transport.ssh import SYSTEM_SOCKET_PATH, channel_kinds_from_env
from gpuctl.transport.streamlocal import open_streamlocal

pytestmark = [
    pytest.mark.sshd,
    pytest.mark.skipif(not sshd_available(), reason="needs /usr/sbin/sshd and ssh-keygen"),
]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("sl-daemon"), gpus=2, seed=5,
                     extra_args=["--log-level", "debug"])  # reads are logged at DEBUG: the peer of each
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def sshd(daemon):
    # GPUCTLD_SOCKET in the sessions: the bridge (with no --socket) finds the daemon, the fast
    # paths (which need a path of their own) do not when the node names no socket
    with SshServer(session_env={"PYTHONPATH": str(REPO_ROOT), "GPUCTLD_SOCKET": str(daemon.socket_path)}) as s:
        yield s


@pytest.fixture(scope="module")
def sshd_no_streamlocal():
    with SshServer(session_env={"PYTHONPATH": str(REPO_ROOT)},
                   extra_config="AllowStreamLocalForwarding no\n") as s:
        yield s


@pytest.fixture
def opened():
    transports = []

    def _open(node, sshd, **options):
        t = open_transport(node, ssh_config_path=str(sshd.ssh_config), known_hosts_path=str(sshd.known_hosts),
                           use_agent=False, **options)
        transports.append(t)
        return t

    yield _open
    for t in transports:
        t.close()


def _node(daemon, **kw):
    return replace(Node(name="gpu01", host="test-sshd", socket=str(daemon.socket_path)), **kw)


def _http_get(channel, path: str) -> bytes:
    channel.sendall(f"GET {path} HTTP/1.1\r\nHost: gpuctld\r\nConnection: close\r\n\r\n".encode())
    channel.settimeout(10)
    out = b""
    while chunk := channel.recv(65536):
        out += chunk
    return out


def _lines(daemon, path: str) -> int:
    """How many requests for `path` the daemon has logged so far."""
    return sum(f'"GET {path} ' in ln for ln in daemon.stderr_text().splitlines())


def _last_peer(daemon, path: str, after: int = 0) -> tuple[int, int]:
    """(uid, pid) of the daemon's last log line for `path`, once it has logged more than `after`."""
    for _ in range(100):
        lines = [ln for ln in daemon.stderr_text().splitlines() if f'"GET {path} ' in ln]
        if len(lines) > after:
            m = re.search(r"uid=(\d+) pid=(\d+)", lines[-1])
            return int(m.group(1)), int(m.group(2))
        time.sleep(0.05)
    raise AssertionError(f"no log line for {path}:\n{daemon.stderr_text()[-2000:]}")


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


# --------------------------------------------------------------------------- the channel open itself


def test_streamlocal_channel_reaches_the_daemon_as_the_login_user(sshd, daemon, opened):
    t = opened(_node(daemon), sshd)
    t.connect()
    ch = open_streamlocal(t._ssh, str(daemon.socket_path), timeout_s=5.0)
    try:
        before = _lines(daemon, "/v1/node")
        ch.sendall(b"GET /v1/node HTTP/1.1\r\nHost: gpuctld\r\n\r\n")
        ch.settimeout(10)
        head = ch.recv(65536)
        assert head.startswith(b"HTTP/1.1 200 ")
        uid, pid = _last_peer(daemon, "/v1/node", before)
        # the peer is sshd's session process of the login user: no bridge, no relay was started
        assert uid == os.getuid()
        assert _comm(pid) == "sshd"
    finally:
        ch.close()
    # the SSH connection is still good after the channel closed
    assert _http_get(open_streamlocal(t._ssh, str(daemon.socket_path), 5.0), "/v1/health").startswith(b"HTTP/1.1 200")


def test_streamlocal_to_a_missing_socket_is_refused_and_the_connection_survives(sshd, daemon, opened, tmp_path):
    t = opened(_node(daemon), sshd)
    t.connect()
    with pytest.raises(paramiko.ChannelException) as info:
        open_streamlocal(t._ssh, str(tmp_path / "nothing.sock"), timeout_s=5.0)
    assert info.value.code == 2  # OPEN_CONNECT_FAILED
    assert t._ssh.is_active()
    ch = open_streamlocal(t._ssh, str(daemon.socket_path), timeout_s=5.0)
    assert _http_get(ch, "/v1/health").startswith(b"HTTP/1.1 200")


def test_sshd_refusing_streamlocal_is_administratively_prohibited(sshd_no_streamlocal, daemon, opened):
    t = opened(_node(daemon), sshd_no_streamlocal)
    t.connect()
    with pytest.raises(paramiko.ChannelException) as info:
        open_streamlocal(t._ssh, str(daemon.socket_path), timeout_s=5.0)
    assert info.value.code == 2  # OpenSSH says OPEN_CONNECT_FAILED here too, and logs why:
    for _ in range(50):
        if f"refused streamlocal port forward: originator  port 0, target {daemon.socket_path}" in \
                sshd_no_streamlocal.log.read_text():
            break
        time.sleep(0.05)
    else:
        raise AssertionError(sshd_no_streamlocal.log.read_text())
    assert t._ssh.is_active()


# --------------------------------------------------------------------------- the transport's choice


def test_transport_uses_streamlocal_over_a_socket_that_never_waits_for_a_delayed_ack(sshd, daemon, opened):
    """The channel-open time itself (<= 20 ms, issue 15) is measured in bench/fleet_scale.py; here:
    the channel kind, sshd as the daemon's peer, and the socket options that keep Nagle and a
    delayed ACK from adding 40 ms to one channel open in twenty (seen in CI before they were set)."""
    t = opened(_node(daemon), sshd)
    c = t.http_client()
    before = _lines(daemon, "/v1/health")
    assert c.get("/v1/health").json()["pid"] == daemon.pid
    assert t.channel_kind == "streamlocal"
    _, pid = _last_peer(daemon, "/v1/health", before)
    assert _comm(pid) == "sshd"
    sock = t._ssh.sock
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    if hasattr(socket, "TCP_QUICKACK"):
        assert type(sock).__name__ == "_QuickAckSocket"
    for _ in range(20):  # channels still open and close on the re-wrapped socket
        t._open_bridge_channel().close()
    assert c.get("/v1/health").json()["pid"] == daemon.pid


def test_refused_streamlocal_falls_back_to_the_relay(sshd_no_streamlocal, daemon, opened, caplog):
    caplog.set_level("INFO", logger="gpuctl")
    t = opened(_node(daemon), sshd_no_streamlocal)
    before = _lines(daemon, "/v1/health")
    assert t.http_client().get("/v1/health").json()["pid"] == daemon.pid
    assert t.channel_kind == "relay"
    uid, pid = _last_peer(daemon, "/v1/health", before)
    assert uid == os.getuid()
    assert _comm(pid).startswith("python3")
    msgs = [r.getMessage() for r in caplog.records if r.name == "gpuctl.transport.ssh"]
    assert any("streamlocal unavailable (sshd did not join a direct-streamlocal@openssh.com channel" in m
               and "trying relay" in m for m in msgs), msgs
    assert any("control channel: relay (python3 -I -S relay to " in m for m in msgs), msgs
    # remembered: the next channel goes straight to the relay, with no second refusal
    refusals = sum("unavailable" in m for m in msgs)
    t._open_bridge_channel().close()
    msgs = [r.getMessage() for r in caplog.records if r.name == "gpuctl.transport.ssh"]
    assert sum("unavailable" in m for m in msgs) == refusals


@pytest.mark.skipif(os.path.exists(SYSTEM_SOCKET_PATH), reason="a system gpuctld runs on this machine")
def test_no_socket_named_falls_back_to_the_bridge_which_finds_the_daemon(sshd, daemon, opened, caplog):
    # the node names no socket: the fast paths try the system daemon's socket, which is not there;
    # the bridge applies the daemon's own rule ($GPUCTLD_SOCKET in the session) and finds it
    caplog.set_level("INFO", logger="gpuctl")
    t = opened(_node(daemon, socket=None), sshd)
    assert t.http_client().get("/v1/health").json()["pid"] == daemon.pid
    assert t.channel_kind == "bridge"
    msgs = [r.getMessage() for r in caplog.records if r.name == "gpuctl.transport.ssh"]
    assert any(f"streamlocal unavailable (sshd did not join a direct-streamlocal@openssh.com channel to {SYSTEM_SOCKET_PATH}" in m
               for m in msgs), msgs
    assert any(f"relay unavailable (gpuctl relay: cannot connect to {SYSTEM_SOCKET_PATH}" in m for m in msgs), msgs


def test_only_streamlocal_and_refused_names_the_reason(sshd_no_streamlocal, daemon, opened):
    t = opened(_node(daemon), sshd_no_streamlocal, channel_kinds=("streamlocal",))
    with pytest.raises(TransportError) as info:
        t.http_client().get("/v1/health")
    assert str(info.value) == (f"node gpu01 (127.0.0.1:{sshd_no_streamlocal.port}): sshd did not join a "
                               f"direct-streamlocal@openssh.com channel to {daemon.socket_path}: Connect failed "
                               "(forwarding off in sshd_config or for the key, or nothing listens there)")
    assert info.value.code == "daemon"
    assert t.channel_kind is None


def test_channel_kinds_env_is_checked():
    assert channel_kinds_from_env("bridge, relay") == ("relay", "bridge")
    assert channel_kinds_from_env("") == ("streamlocal", "relay", "bridge")
    with pytest.raises(ValueError, match=r"GPUCTL_SSH_CHANNELS='ssh': unknown channel kind 'ssh'"):
        channel_kinds_from_env("ssh")


# --------------------------------------------------------------------------- the audit's user


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to log in as another user")
def test_peer_uid_is_the_ssh_login_user_not_the_client(tmp_path):
    """Log in as user nobody (shell nologin: no exec channel can run at all): the streamlocal
    channel still reaches the daemon, and the daemon sees uid 65534, not root's 0."""
    import pwd

    nobody = pwd.getpwnam("nobody")
    base = Path(tempfile.mkdtemp(prefix="gpuctl-sl-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        sock = base / "gpuctld.sock"
        d = DaemonProc(sock, base / "state", ["serve", "--backend", "simulated", "--gpus", "1", "--seed", "1",
                                              "--state-dir", str(base / "state"), "--socket", str(sock), "--log-level", "debug"],
                       base / "gpuctld.log")
        d.start()
        try:
            os.chmod(sock, 0o666)
            with SshServer() as s:
                os.chmod(s.dir, 0o755)  # sshd reads authorized_keys as the user logging in
                os.chmod(s.authorized_keys, 0o644)
                t = open_transport(Node(name="gpu01", host="test-sshd", user="nobody", socket=str(sock)),
                                   ssh_config_path=str(s.ssh_config), known_hosts_path=str(s.known_hosts),
                                   use_agent=False)
                try:
                    before = _lines(d, "/v1/health")  # start() polled /v1/health as root
                    assert t.http_client().get("/v1/health").json()["pid"] == d.pid
                    assert t.channel_kind == "streamlocal"
                    uid, pid = _last_peer(d, "/v1/health", before)
                    assert uid == nobody.pw_uid != os.getuid()
                finally:
                    t.close()
        finally:
            d.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --------------------------------------------------------------------------- gpuctl -v


def test_verbose_names_the_path_on_stderr_and_keeps_stdout_data(sshd, daemon, tmp_path):
    cfg = tmp_path / "fleet.toml"
    cfg.write_text(f'[[node]]\nname = "gpu01"\nhost = "test-sshd"\nsocket = "{daemon.socket_path}"\n'
                   f'gpuctld = "{sys.executable} -m gpuctl.daemon"\n')
    args = ("--config", str(cfg), "--ssh-config", str(sshd.ssh_config), "--known-hosts", str(sshd.known_hosts))
    r = run_cli(*args, "status", "--json", "-v", env={"SSH_AUTH_SOCK": ""})
    assert r.code == 0, r.stderr
    assert r.json["nodes"][0]["reachable"] is True
    assert (f"gpuctl: node gpu01 (127.0.0.1:{sshd.port}): control channel: streamlocal "
            f"(direct-streamlocal@openssh.com to {daemon.socket_path}), opened in ") in r.stderr
    quiet = run_cli(*args, "status", "--json", env={"SSH_AUTH_SOCK": ""})
    assert quiet.code == 0 and quiet.stderr == ""
    forced = run_cli(*args, "-v", "status", "--json", env={"SSH_AUTH_SOCK": "", "GPUCTL_SSH_CHANNELS": "bridge"})
    assert forced.code == 0, forced.stderr
    assert "control channel: bridge (`" in forced.stderr


def test_streamlocal_needs_no_gpuctl_on_the_login_path(sshd, daemon, opened):
    # a node whose gpuctld command is wrong for this account is still reached: nothing runs there
    t = opened(_node(daemon, gpuctld="/nonexistent/bin/gpuctld"), sshd)
    assert t.http_client().get("/v1/health").json()["pid"] == daemon.pid
    assert t.channel_kind == "streamlocal"
