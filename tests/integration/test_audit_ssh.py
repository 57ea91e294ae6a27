"""The audit log over a REAL OpenSSH sshd: the record names the SSH login user (the account the
`gpuctld bridge` runs as), the peer uid, the SSH client address and the user@host gpuctl reports."""

from __future__ import annotations

import getpass
import os
import socket

import pytest

from daemon_proc import REPO_ROOT, start_daemon
from fleet_fixtures import run_cli, ssh_cli_args, sshd_node, write_fleet_config
from sshd import SshServer, sshd_available

pytestmark = [pytest.mark.sshd,
              pytest.mark.skipif(not sshd_available(), reason="needs /usr/sbin/sshd and ssh-keygen")]


@pytest.mark.parametrize("channel", ["bridge", "streamlocal"])
def test_audit_over_ssh_shows_the_ssh_login_user(tmp_path, channel):
    """Whichever way gpuctl reaches the socket (GPUCTL_SSH_CHANNELS), the peer is the SSH login
    user; the SSH client address is known through the bridge (its SSH_CONNECTION) and not through
    sshd's stream-local channel (the peer is sshd's session process, which has no such variable)."""
    env = {"GPUCTL_SSH_CHANNELS": channel}
    d = start_daemon(tmp_path, gpus=2, seed=41, name="alpha")
    try:
        with SshServer(session_env={"PYTHONPATH": str(REPO_ROOT)}) as sshd:
            cfg = write_fleet_config(tmp_path / "fleet.toml", {"alpha": sshd_node(d.socket_path)}, {"research": 10})
            ssh = ssh_cli_args(cfg, sshd)
            r = run_cli("reassign", "--from", "unassigned", "--to", "research", "--count", "1", "--yes",
                        "--request-id", "over-ssh", *ssh, env=env)
            assert r.code == 0, r.stderr
            au = run_cli("audit", "--json", *ssh, env=env)
            assert au.code == 0, au.stderr
    finally:
        d.stop()
    (change,) = [rec for rec in au.json["records"] if rec.get("request_id") == "over-ssh" and rec.get("moved")]
    who = change["who"]
    assert who["ssh_user"] == sshd.user == getpass.getuser()
    assert who["peer_uid"] == os.getuid() and isinstance(who["peer_pid"], int)
    if channel == "bridge":
        assert who["ssh_client"].startswith("127.0.0.1 port ")  # from the bridge's SSH_CONNECTION
    else:
        assert who["ssh_client"] is None  # not known to the daemon on this path: never made up
    assert who["reported"] == f"{getpass.getuser()}@{socket.gethostname()}"
    assert change["node"] == socket.gethostname() and change["action"] == "assign"
    ends = [rec for rec in au.json["records"] if rec.get("request_id") == "over-ssh" and rec.get("phase") == "end"]
    assert ends and ends[0]["outcome"] == "ok" and ends[0]["status"] == 200
