"""SshTransport against a REAL OpenSSH sshd on 127.0.0.1 and a real gpuctld (simulated backend).

One sshd and one daemon per module (tests/sshd.py, tests/daemon_proc.py); each test opens its own
transport. Covers cases ssh-02 (encrypted / unreadable-cipher keys; ssh-01 is in test_transport.py).
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from daemon_proc import start_daemon
from sshd import Node, free_port, keygen, sshd_available
from tests.support.transport import expect_transport_error as _fail

from gpuctl.transport.ssh import SshTransport

pytestmark = [
    pytest.mark.sshd,
    pytest.mark.skipif(not sshd_available(), reason="needs /usr/sbin/sshd and ssh-keygen"),
]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("sshd-daemon"), gpus=2, seed=3)
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def node(sshd, daemon):
    return Node(name="gpu01", host="test-sshd", socket=str(daemon.socket_path))


def _fingerprint(pub: Path) -> str:
    """SHA256:... as ssh-keygen itself prints it (the reference for ours)."""
    out = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout
    return out.split()[1]


# --------------------------------------------------------------------------- working paths


def test_health_over_ssh_reaches_the_daemon(sshd, daemon, node, opened):
    t = opened(node, sshd)
    assert isinstance(t, SshTransport)
    answer = t.http_client().get("/v1/health")
    assert answer.status_code == 200
    body = answer.json()
    assert body["ok"] is True
    assert body["pid"] == daemon.pid
    assert t.address == f"127.0.0.1:{sshd.port}"


def test_keep_alive_two_requests_one_connection_one_channel(sshd, node, opened):
    t = opened(node, sshd)
    client = t.http_client()
    assert client is t.http_client()
    first = client.get("/v1/health").json()
    second = client.get("/v1/slices").json()
    assert first["ok"] is True
    assert len(second["slices"]) == 2  # 2 simulated GPUs, one whole slice each
    assert (t.connections_opened, t.channels_opened) == (1, 1)


def test_dead_ssh_connection_is_reopened_on_next_request(sshd, node, opened):
    t = opened(node, sshd)
    client = t.http_client()
    assert client.get("/v1/health").status_code == 200
    t._ssh.sock.close()  # the network dropped: the kept SSH connection is dead
    t._ssh.close()
    assert client.get("/v1/health").json()["ok"] is True
    assert t.connections_opened == 2
    assert t.channels_opened == 2


def test_proxyjump_through_a_jump_host(sshd, node, opened, tmp_path):
    cfg = tmp_path / "config"
    cfg.write_text(
        f"Host jumpbox\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.user_key}\n  IdentitiesOnly yes\n"
        f"Host behind\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.user_key}\n  ProxyJump jumpbox\n"
    )
    t = opened(replace(node, host="behind"), sshd, ssh_config_path=str(cfg))
    assert t.http_client().get("/v1/health").json()["ok"] is True
    assert t.jump_hosts == [f"127.0.0.1:{sshd.port}"]


def test_proxyjump_failures_name_the_hop(sshd, node, opened, tmp_path):
    dead = free_port()
    cfg = tmp_path / "config"
    cfg.write_text(
        f"Host deadjump\n  HostName 127.0.0.1\n  Port {dead}\n"
        f"Host jumpbox\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.user_key}\n"
        f"Host via-dead\n  HostName 127.0.0.1\n  Port {sshd.port}\n  ProxyJump deadjump\n"
        f"Host nothing-behind\n  HostName 127.0.0.1\n  Port {dead}\n  ProxyJump jumpbox\n"
    )
    err = _fail(opened(replace(node, host="via-dead"), sshd, ssh_config_path=str(cfg)))
    assert str(err) == (
        f"node gpu01 (127.0.0.1:{sshd.port}): jump host deadjump (127.0.0.1:{dead}): connection refused"
    )
    t = opened(replace(node, host="nothing-behind"), sshd, ssh_config_path=str(cfg))
    err = _fail(t)
    assert str(err).startswith(f"node gpu01 (127.0.0.1:{dead}): the jump host could not reach 127.0.0.1:{dead}")
    assert err.code == "unreachable"
    assert t.jump_hosts == []  # the hop opened for the attempt was closed again


# --------------------------------------------------------------------------- host keys


def test_unknown_host_key_refused_with_fingerprint_then_accepted(sshd, node, opened, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    err = _fail(opened(node, sshd, known_hosts_path=str(known)))
    fingerprint = _fingerprint(sshd.host_pub)
    assert err.code == "host_key_unknown"
    assert str(err).startswith(f"node gpu01 (127.0.0.1:{sshd.port}): host key is not known: ")
    assert f"ED25519 key fingerprint is {fingerprint}" in str(err)
    assert "--accept-new-host-key" in str(err) and str(known) in str(err)
    assert known.read_text() == ""  # nothing written without the option

    t = opened(node, sshd, known_hosts_path=str(known), accept_new_host_key=True)
    assert t.http_client().get("/v1/health").json()["ok"] is True
    key_type, key_b64 = sshd.host_pub.read_text().split()[:2]
    assert known.read_text() == f"[127.0.0.1]:{sshd.port} {key_type} {key_b64}\n"
    # and now it is known: a plain transport connects
    assert opened(node, sshd, known_hosts_path=str(known)).http_client().get("/v1/health").status_code == 200


def test_changed_host_key_refused_loudly_and_file_untouched(sshd, node, opened, tmp_path):
    other = keygen(tmp_path / "other_host_key")
    key_type, key_b64 = (tmp_path / "other_host_key.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    before = f"# a comment\n[127.0.0.1]:{sshd.port} {key_type} {key_b64}\n"
    known.write_text(before)
    assert other.exists()
    err = _fail(opened(node, sshd, known_hosts_path=str(known), accept_new_host_key=True))
    assert err.code == "host_key_changed"
    msg = str(err)
    assert f"HOST KEY FOR 127.0.0.1:{sshd.port} HAS CHANGED" in msg
    assert "possible man-in-the-middle" in msg
    assert f"remove the old key from {known}:2 if the change is expected" in msg
    assert _fingerprint(sshd.host_pub) in msg
    assert known.read_text() == before


def test_host_key_change_in_a_remembered_known_hosts_is_never_missed(sshd, node, opened, tmp_path, monkeypatch):
    """known_hosts is read once per process while unchanged (gpuctl.transport.filememo). A change
    to another host key of the same size is seen at the next connection: rewritten in place with
    its old mtime put back (only the ctime moves), and replaced by rename within the same second."""
    import gpuctl.transport.filememo as filememo

    monkeypatch.setattr(filememo, "RACY_S", 0.05)
    key_type, key_b64 = sshd.host_pub.read_text().split()[:2]
    keygen(tmp_path / "other_host_key")
    other_type, other_b64 = (tmp_path / "other_host_key.pub").read_text().split()[:2]
    good = f"[127.0.0.1]:{sshd.port} {key_type} {key_b64}\n"
    bad = f"[127.0.0.1]:{sshd.port} {other_type} {other_b64}\n"
    assert len(good) == len(bad)
    known = tmp_path / "known_hosts"
    known.write_text(good)
    os.utime(known, (time.time() - 60, time.time() - 60))
    time.sleep(0.1)
    from gpuctl.transport import knownhosts

    before = knownhosts._PARSED.hits
    for _ in range(3):  # learnt, confirmed, then handed out from memory
        assert opened(node, sshd, known_hosts_path=str(known)).http_client().get("/v1/health").status_code == 200
    assert knownhosts._PARSED.hits > before
    st = os.stat(known)
    with open(known, "r+") as f:
        f.write(bad)
    os.utime(known, ns=(st.st_atime_ns, st.st_mtime_ns))
    err = _fail(opened(node, sshd, known_hosts_path=str(known)))
    assert err.code == "host_key_changed" and f"HOST KEY FOR 127.0.0.1:{sshd.port} HAS CHANGED" in str(err)
    assert known.read_text() == bad  # the file is left as it is

    fresh = tmp_path / "known_hosts.new"  # back to the good key, then a same-size swap by rename
    fresh.write_text(good)
    os.replace(fresh, known)
    assert opened(node, sshd, known_hosts_path=str(known)).http_client().get("/v1/health").status_code == 200
    fresh.write_text(bad)
    os.replace(fresh, known)
    err = _fail(opened(node, sshd, known_hosts_path=str(known)))
    assert err.code == "host_key_changed"
    known.unlink()  # deleted: the host is unknown again, never the remembered key
    assert _fail(opened(node, sshd, known_hosts_path=str(known))).code == "host_key_unknown"
    assert not known.exists()


def test_known_hosts_that_cannot_be_read_is_named(sshd, node, opened, tmp_path):
    """A known_hosts path that exists but cannot be read (here a directory; for a user, mode 000)
    fails with the file named, code "config"; before: "node gpu01 (...): is a directory"."""
    known = tmp_path / "known_hosts"
    known.mkdir()
    err = _fail(opened(node, sshd, known_hosts_path=str(known)))
    assert err.code == "config"
    assert str(err) == f"node gpu01 (127.0.0.1:{sshd.port}): known_hosts file {known} cannot be read: Is a directory"
    assert known.is_dir() and not any(known.iterdir())


# --------------------------------------------------------------------------- connect and auth failures


def test_wrong_port_connection_refused_names_node(sshd, node, opened):
    port = free_port()
    err = _fail(opened(replace(node, port=port), sshd))
    assert str(err) == f"node gpu01 (127.0.0.1:{port}): connection refused"
    assert err.code == "unreachable"


def test_silent_server_times_out_after_node_timeout(sshd, node, opened):
    with socket.socket() as listener:  # accepts TCP, never says a word
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        t = opened(replace(node, port=port, timeout_s=0.5), sshd)
        start = time.monotonic()
        err = _fail(t)
        elapsed = time.monotonic() - start
    assert str(err).startswith(f"node gpu01 (127.0.0.1:{port}): timed out after 0.5 s")
    assert err.code == "timeout"
    assert elapsed < 3.0


def test_unauthorized_key_authentication_failed(sshd, node, opened, tmp_path):
    stranger = keygen(tmp_path / "stranger")
    err = _fail(opened(replace(node, identity_file=str(stranger)), sshd))
    assert str(err) == (
        f"node gpu01 (127.0.0.1:{sshd.port}): authentication failed for user {sshd.user} "
        f"(tried keys: {stranger})"
    )
    assert err.code == "auth"


def test_encrypted_key_without_passphrase_case_ssh02(sshd, node, opened, tmp_path):
    k1 = keygen(tmp_path / "k1", passphrase="secret")
    sshd.authorize(tmp_path / "k1.pub")
    err = _fail(opened(replace(node, identity_file=str(k1)), sshd))
    assert str(err).startswith(
        f"node gpu01 (127.0.0.1:{sshd.port}): key {k1} is encrypted: give a passphrase or use the agent"
    )
    assert err.code == "key"
    # with the passphrase the same key logs in
    t = opened(replace(node, identity_file=str(k1)), sshd, passphrase="secret")
    assert t.http_client().get("/v1/health").json()["ok"] is True


def test_unreadable_cipher_key_case_ssh02_and_agent_way_out(sshd, node, opened, tmp_path, monkeypatch):
    k2 = keygen(tmp_path / "k2", passphrase="secret", cipher="aes256-gcm@openssh.com")
    sshd.authorize(tmp_path / "k2.pub")
    err = _fail(opened(replace(node, identity_file=str(k2)), sshd, passphrase="secret"))
    assert f"key {k2} uses a cipher this client cannot read: use the agent or re-encrypt it" in str(err)
    assert "aes256-gcm@openssh.com" in str(err)
    assert err.code == "key"

    # the advice works: an ssh-agent holding the key lets the same node config log in
    agent_sock = tmp_path / "agent.sock"
    askpass = tmp_path / "askpass.sh"
    askpass.write_text("#!/bin/sh\necho secret\n")
    askpass.chmod(0o700)
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(agent_sock)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while not agent_sock.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        env = {**os.environ, "SSH_AUTH_SOCK": str(agent_sock), "SSH_ASKPASS": str(askpass),
               "SSH_ASKPASS_REQUIRE": "force", "DISPLAY": ":0"}
        subprocess.run(["ssh-add", str(k2)], env=env, check=True, capture_output=True, timeout=10,
                       stdin=subprocess.DEVNULL)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(agent_sock))
        t = opened(replace(node, identity_file=str(k2)), sshd, use_agent=True)
        assert t.http_client().get("/v1/health").json()["ok"] is True

        # IdentitiesOnly (in sshd.ssh_config): the agent's k2 is not offered for another identity file
        stranger = keygen(tmp_path / "stranger")
        err = _fail(opened(replace(node, identity_file=str(stranger)), sshd, use_agent=True))
        assert err.code == "auth" and f"(tried keys: {stranger})" in str(err)
        # without IdentitiesOnly the agent's keys are tried after the file, as ssh does
        loose = tmp_path / "config"
        loose.write_text(f"Host test-sshd\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n")
        t = opened(replace(node, identity_file=str(stranger)), sshd, use_agent=True, ssh_config_path=str(loose))
        assert t.http_client().get("/v1/health").json()["ok"] is True
    finally:
        agent.terminate()
        agent.wait(5)


# --------------------------------------------------------------------------- the daemon end


def test_missing_socket_says_gpuctld_not_running(sshd, node, opened, tmp_path):
    missing = tmp_path / "nowhere" / "gpuctld.sock"
    t = opened(replace(node, socket=str(missing)), sshd)
    err = _fail(t)
    assert str(err) == (
        f"node gpu01 (127.0.0.1:{sshd.port}): gpuctld is not running on this node: no socket at {missing}"
    )
    assert err.code == "daemon"
    assert not missing.exists()


def test_gpuctld_not_installed(sshd, node, opened):
    # the bridge's own error path (streamlocal would reach the running daemon without gpuctld)
    err = _fail(opened(replace(node, gpuctld="/nonexistent/bin/gpuctld"), sshd, channel_kinds=("bridge",)))
    assert "gpuctld is not installed on this node ('/nonexistent/bin/gpuctld' not found)" in str(err)
    assert str(err).startswith(f"node gpu01 (127.0.0.1:{sshd.port}): ")
    assert err.code == "daemon"


def test_daemon_restart_between_requests_uses_a_new_channel(sshd, daemon, node, opened):
    t = opened(node, sshd)
    client = t.http_client()
    assert client.get("/v1/health").json()["pid"] == daemon.pid
    daemon.restart()
    assert client.get("/v1/health").json()["pid"] == daemon.pid
    assert t.channels_opened == 2 and t.connections_opened == 1


def test_concurrent_requests_share_one_ssh_connection(sshd, node, opened):
    t = opened(node, sshd)
    client = t.http_client()
    results: list[int] = []

    def worker():
        results.append(client.get("/v1/health").status_code)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    assert results == [200, 200, 200]
    assert t.connections_opened == 1
    assert 1 <= t.channels_opened <= 3
