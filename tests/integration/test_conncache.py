"""Issue 15 item 3: the opt-in SSH connection cache (GPUCTL_SSH_CACHE), against a real sshd.

Two `gpuctl status --json` runs share one SSH connection held by the per-user cache process; its
socket is 0600 in a 0700 directory of the user's runtime dir; it exits after its idle time; host
key rules are the same as without it.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from daemon_proc import REPO_ROOT, start_daemon
from fleet_fixtures import run_cli
from sshd import Node, SshServer, sshd_available

from gpuctl.transport import TransportError, open_transport
from gpuctl.transport.conncache import CachedSshTransport, cache_idle_s, cache_stats

pytestmark = [
    pytest.mark.sshd,
    pytest.mark.skipif(not sshd_available(), reason="needs /usr/sbin/sshd and ssh-keygen"),
]


@pytest.fixture(scope="module")
def sshd():
    with SshServer(session_env={"PYTHONPATH": str(REPO_ROOT)}) as s:
        yield s


@pytest.fixture
def daemon(tmp_path):
    with start_daemon(tmp_path, gpus=2, seed=9) as d:
        yield d


def _wait_gone(path: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not os.path.exists(path):
            return True
        time.sleep(0.1)
    return False


def test_two_commands_share_one_ssh_connection_then_the_cache_exits(sshd, daemon, tmp_path):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    cfg = tmp_path / "fleet.toml"
    # four nodes (the same daemon): the first command's four threads all find no cache at once
    cfg.write_text("".join(f'[[node]]\nname = "gpu0{i}"\nhost = "test-sshd"\nsocket = "{daemon.socket_path}"\n'
                           f'gpuctld = "{sys.executable} -m gpuctl.daemon"\n' for i in range(1, 5)))
    args = ("--config", str(cfg), "--ssh-config", str(sshd.ssh_config), "--known-hosts", str(sshd.known_hosts))
    env = {"SSH_AUTH_SOCK": "", "XDG_RUNTIME_DIR": str(runtime), "GPUCTL_SSH_CACHE": "3"}
    sock = runtime / "gpuctl" / "ssh-cache.sock"
    pid = None
    try:
        for _ in range(2):
            r = run_cli(*args, "status", "--json", "-v", env=env)
            assert r.code == 0, r.stderr
            assert [(n["reachable"], len(n["gpus"])) for n in r.json["nodes"]] == [(True, 2)] * 4
            assert f"gpuctl: node gpu01: control channel: streamlocal, through the SSH connection cache {sock}" \
                in r.stderr
        stats = cache_stats(str(sock))
        pid = stats["pid"]
        # one cache process, however many threads of the first command found none
        assert [line for line in os.popen("ps -eo pid,args -ww").read().splitlines()
                if "gpuctl.transport.conncache serve" in line and str(sock) in line] == \
            [line for line in os.popen("ps -eo pid,args -ww").read().splitlines()
             if line.split(None, 1)[0] == str(pid)]
        assert stats["transports"] == 4
        assert stats["connections_opened"] == 4  # one handshake per node for both commands
        assert stats["channels_opened"] >= 8
        assert os.stat(sock).st_mode & 0o777 == 0o600
        assert os.stat(sock.parent).st_mode & 0o777 == 0o700
        # idle for 3 s with nothing open: it exits and removes its socket
        assert _wait_gone(str(sock), 10.0)
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the cache process did not exit")
        pid = None
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGTERM)


def test_host_key_rules_are_unchanged_through_the_cache(sshd, daemon, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("GPUCTL_SSH_CACHE", "2")
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    node = Node(name="gpu01", host="test-sshd", socket=str(daemon.socket_path))
    t = open_transport(node, ssh_config_path=str(sshd.ssh_config), known_hosts_path=str(empty), use_agent=False)
    assert isinstance(t, CachedSshTransport)
    try:
        with pytest.raises(TransportError) as info:
            t.http_client().get("/v1/health")
    finally:
        t.close()
    assert info.value.code == "host_key_unknown"
    assert str(info.value).startswith(f"node gpu01 (127.0.0.1:{sshd.port}): host key is not known: ")
    assert empty.read_text() == ""  # nothing was trusted on the way
    stats = cache_stats(str(tmp_path / "gpuctl" / "ssh-cache.sock"))
    assert stats["connections_opened"] == 0
    assert _wait_gone(str(tmp_path / "gpuctl" / "ssh-cache.sock"), 10.0)


def test_cache_setting_is_checked(monkeypatch):
    assert cache_idle_s("") is None and cache_idle_s("0") is None
    assert cache_idle_s("1") == 600.0 and cache_idle_s("90") == 90.0
    with pytest.raises(ValueError, match=r"GPUCTL_SSH_CACHE='yes': expected 1 \(on\) or the idle time in seconds"):
        cache_idle_s("yes")
    monkeypatch.setenv("GPUCTL_SSH_CACHE", "-5")
    with pytest.raises(TransportError) as info:
        open_transport(Node(name="gpu01", host="h"))
    assert info.value.code == "config" and "GPUCTL_SSH_CACHE='-5'" in str(info.value)
