"""The audit log over a REAL OpenSSH sshd: the record names the SSH login user (the account the
`gpuctld bridge` runs as), the peer uid, the SSH client address and the user@host gpuctl reports."""

from __future__ import annotations

import getpass
import os
import socket
import sys

import pytest

from daemon_proc import REPO_ROOT, start_daemon
from fleet_fixtures import run_cli
from sshd import SshServer, sshd_available

pytestmark = [pytest.mark.sshd,
              pytest.mark.skipif(not sshd_available(), reason="needs /usr/sbin/sshd and ssh-keygen")]

CONFIG = """
[[department]]
name = "research"
priority = 10

[[node]]
name = "alpha"
host = "test-sshd"
socket = "{s1}"
gpuctld = "{gpuctld}"
timeout_s = 8
"""


def test_audit_over_ssh_shows_the_ssh_login_user(tmp_path):
    d = start_daemon(tmp_path, gpus=2, seed=41, name="alpha")
    try:
        with SshServer(session_env={"PYTHONPATH": str(REPO_ROOT)}) as sshd:
            cfg = tmp_path / "fleet.toml"
            cfg.write_text(CONFIG.format(s1=d.socket_path, gpuctld=f"{sys.executable} -m gpuctl.daemon"))
            ssh = ("--config", str(cfg), "--ssh-config", str(sshd.ssh_config), "--known-hosts", str(sshd.known_hosts))
            r = run_cli("reassign", "--from", "unassigned", "--to", "research", "--count", "1", "--yes",
                        "--request-id", "over-ssh", *ssh)
            assert r.code == 0, r.stderr
            au = run_cli("audit", "--json", *ssh)
            assert au.code == 0, au.stderr
    finally:
        d.stop()
    (change,) = [rec for rec in au.json["records"] if rec.get("request_id") == "over-ssh" and rec.get("moved")]
    who = change["who"]
    assert who["ssh_user"] == sshd.user == getpass.getuser()
    assert who["peer_uid"] == os.getuid() and isinstance(who["peer_pid"], int)
    assert who["ssh_client"].startswith("127.0.0.1 port ")  # from the bridge's SSH_CONNECTION
    assert who["reported"] == f"{getpass.getuser()}@{socket.gethostname()}"
    assert change["node"] == socket.gethostname() and change["action"] == "assign"
    ends = [rec for rec in au.json["records"] if rec.get("request_id") == "over-ssh" and rec.get("phase") == "end"]
    assert ends and ends[0]["outcome"] == "ok" and ends[0]["status"] == 200
