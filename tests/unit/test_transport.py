"""Transport units without sshd: ssh config (case ssh-01), known_hosts, key loading, errors, local socket."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socketserver
import subprocess
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from sshd import keygen

from gpuctl.transport import LocalTransport, TransportError, open_transport, transport_error
from gpuctl.transport.knownhosts import KnownHosts, fingerprint_sha256, host_entry_name
from gpuctl.transport.ssh import bridge_command
from gpuctl.transport.sshconfig import SshConfigError, load_config, resolve_host
from gpuctl.transport.sshkeys import KeyLoadError, load_private_key, public_blob

CASE_INCLUDE = Path(__file__).resolve().parents[1] / "cases" / "ssh" / "include"
HAVE_SSH = shutil.which("ssh") is not None and shutil.which("ssh-keygen") is not None


def node(**kw):
    base = dict(name="n1", host="h", user=None, port=None, identity_file=None, socket=None,
                transport="ssh", gpuctld="gpuctld", timeout_s=5.0)
    return SimpleNamespace(**{**base, **kw})


# --------------------------------------------------------------------------- ssh config (ssh-01)


def test_include_case_ssh01_resolves_host_from_included_file():
    host = resolve_host("gpu01", config_path=str(CASE_INCLUDE / "config"), include_dir=str(CASE_INCLUDE))
    assert (host.hostname, host.user, host.port) == ("127.0.0.1", "ops", 2222)
    assert host.server_alive_interval_s == 30.0  # the Host * block after the Include still applies
    assert host.address == "127.0.0.1:2222"


def test_include_relative_paths_are_under_dot_ssh_by_default(tmp_path, monkeypatch):
    home = tmp_path / "home"
    shutil.copytree(CASE_INCLUDE, home / ".ssh")
    monkeypatch.setenv("HOME", str(home))
    host = resolve_host("gpu01", config_path=str(home / ".ssh" / "config"))
    assert (host.hostname, host.user, host.port) == ("127.0.0.1", "ops", 2222)


@pytest.mark.skipif(not HAVE_SSH, reason="needs OpenSSH's ssh")
def test_include_resolution_matches_ssh_G(tmp_path):
    cfg = tmp_path / "config"
    cfg.write_text(
        f"Include {CASE_INCLUDE}/config.d/*.conf\n"
        "Host db*\n  Include " + str(tmp_path / "inner.conf") + "\n  User dbadmin\n"
        "Host *\n  ServerAliveInterval 30\n  User fallback\n"
    )
    (tmp_path / "inner.conf").write_text("Port 2200\nHost other\n  Port 9\n")
    for alias in ("gpu01", "db1", "plain"):
        out = subprocess.run(["ssh", "-G", "-F", str(cfg), alias], capture_output=True, text=True,
                             check=True, timeout=10).stdout
        ssh_g = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
        ours = resolve_host(alias, config_path=str(cfg))
        assert (ours.hostname, ours.user, str(ours.port)) == (ssh_g["hostname"], ssh_g["user"], ssh_g["port"]), alias
    # Include inside "Host db*": its own "Host other" must not swallow "User dbadmin"
    assert resolve_host("db1", config_path=str(cfg)).user == "dbadmin"


def test_node_fields_override_ssh_config():
    host = resolve_host("gpu01", config_path=str(CASE_INCLUDE / "config"), include_dir=str(CASE_INCLUDE),
                        user="admin", port=22, identity_file="~/keys/gpu")
    assert (host.user, host.port) == ("admin", 22)
    assert host.identity_files == (os.path.expanduser("~/keys/gpu"),)
    assert host.identity_files_given is True


def test_include_loop_is_an_error_naming_the_file(tmp_path):
    loop = tmp_path / "loop.conf"
    loop.write_text(f"Include {loop}\n")
    with pytest.raises(SshConfigError) as info:
        load_config(str(loop))
    assert "Include nested deeper than 16 levels" in str(info.value)
    assert str(loop) in str(info.value)


def test_bad_port_and_missing_explicit_config_are_errors(tmp_path):
    cfg = tmp_path / "config"
    cfg.write_text("Host x\n  Port twenty\n")
    with pytest.raises(SshConfigError, match=f"{cfg}:2: Port 'twenty' is not a number"):
        resolve_host("x", config_path=str(cfg))
    with pytest.raises(SshConfigError, match=f"ssh config {tmp_path / 'missing'} does not exist"):
        resolve_host("x", config_path=str(tmp_path / "missing"))


def test_bad_ssh_config_becomes_transport_error_naming_node(tmp_path):
    cfg = tmp_path / "config"
    cfg.write_text("Host h\n  Port 70000\n")
    t = open_transport(node(), ssh_config_path=str(cfg))
    with pytest.raises(TransportError) as info:
        t.http_client().get("/v1/health")
    assert str(info.value) == f"node n1 (h): {cfg}:2: Port 70000 is out of range 1-65535"
    assert info.value.code == "config"
    assert t.connections_opened == 0
    t.close()


def test_proxyjump_hops_parsed(tmp_path):
    cfg = tmp_path / "config"
    cfg.write_text("Host far\n  ProxyJump ops@bastion:2200,[::1]:22\n")
    assert resolve_host("far", config_path=str(cfg)).proxy_jump == ("ops@bastion:2200", "[::1]:22")


# --------------------------------------------------------------------------- known_hosts


def _pub(tmp_path, name="hk"):
    keygen(tmp_path / name)
    key_type, b64 = (tmp_path / f"{name}.pub").read_text().split()[:2]
    return key_type, b64, base64.b64decode(b64)


def test_known_hosts_port_names_hashed_entries_and_fingerprint(tmp_path):
    key_type, b64, blob = _pub(tmp_path)
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[10.0.0.5]:2222 {key_type} {b64}\ngpu02.example.com {key_type} {b64}\n")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(kh)], check=True, capture_output=True, timeout=10)
    assert "gpu02" not in kh.read_text()  # hashed by OpenSSH itself
    known = KnownHosts(str(kh))
    assert known.check(host_entry_name("10.0.0.5", 2222), blob).status == "ok"
    assert known.check(host_entry_name("gpu02.example.com", 22), blob).status == "ok"
    assert known.check(host_entry_name("10.0.0.5", 22), blob).status == "unknown"
    ref = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "hk.pub")], capture_output=True, text=True).stdout
    assert fingerprint_sha256(blob) == ref.split()[1]


def test_known_hosts_wildcards_negation_and_revoked(tmp_path):
    key_type, b64, blob = _pub(tmp_path)
    _, other_b64, other_blob = _pub(tmp_path, "other")
    kh = tmp_path / "known_hosts"
    kh.write_text(f"gpu*.lab,!gpu9.lab {key_type} {b64}\n@revoked * {key_type} {other_b64}\n")
    known = KnownHosts(str(kh))
    assert known.check("gpu1.lab", blob).status == "ok"
    assert known.check("gpu9.lab", blob).status == "unknown"
    changed = known.check("gpu1.lab", base64.b64decode(_pub(tmp_path, "third")[1]))
    assert (changed.status, changed.line.where) == ("changed", f"{kh}:1")
    revoked = known.check("gpu1.lab", other_blob)
    assert (revoked.status, revoked.line.where) == ("revoked", f"{kh}:2")


def test_known_hosts_add_creates_private_file(tmp_path):
    key_type, b64, blob = _pub(tmp_path)
    path = tmp_path / "sub" / "known_hosts"
    known = KnownHosts(str(path))
    known.add("[127.0.0.1]:2222", key_type, blob)
    assert path.read_text() == f"[127.0.0.1]:2222 {key_type} {b64}\n"
    assert (path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    assert known.check("[127.0.0.1]:2222", blob).status == "ok"


# --------------------------------------------------------------------------- identity files (ssh-02)


def test_key_messages(tmp_path):
    k1 = keygen(tmp_path / "k1", passphrase="secret")
    k2 = keygen(tmp_path / "k2", passphrase="secret", cipher="aes256-gcm@openssh.com")
    rsa = keygen(tmp_path / "rsa", passphrase="secret", key_type="rsa", extra=("-m", "PEM", "-b", "1024"))
    with pytest.raises(KeyLoadError) as info:
        load_private_key(str(k1))
    assert (str(info.value), info.value.code) == (f"key {k1} is encrypted: give a passphrase or use the agent", "encrypted")
    for passphrase in (None, "secret"):
        with pytest.raises(KeyLoadError) as info:
            load_private_key(str(k2), passphrase)
        assert str(info.value).startswith(f"key {k2} uses a cipher this client cannot read: use the agent or re-encrypt it")
    with pytest.raises(KeyLoadError) as info:
        load_private_key(str(k1), "wrong")
    assert str(info.value) == f"key {k1}: wrong passphrase (could not decrypt it)"
    assert "Proc-Type: 4,ENCRYPTED" in rsa.read_text()  # traditional PEM
    with pytest.raises(KeyLoadError, match="is encrypted: give a passphrase"):
        load_private_key(str(rsa))
    assert load_private_key(str(k1), "secret").asbytes() == public_blob(str(k1))
    assert load_private_key(str(rsa), "secret").get_name() == "ssh-rsa"
    junk = tmp_path / "junk"
    junk.write_text("hello\n")
    with pytest.raises(KeyLoadError, match=f"key {junk} is not a private key this client can read"):
        load_private_key(str(junk))
    with pytest.raises(KeyLoadError, match=f"key {tmp_path / 'absent'} does not exist"):
        load_private_key(str(tmp_path / "absent"))


def test_public_blob_without_pub_file_reads_the_openssh_header(tmp_path):
    k1 = keygen(tmp_path / "k1", passphrase="secret")
    blob = public_blob(str(k1))
    (tmp_path / "k1.pub").unlink()
    assert public_blob(str(k1)) == blob is not None


# --------------------------------------------------------------------------- command, errors, open_transport


def test_bridge_command_is_shell_quoted():
    assert bridge_command("gpuctld", None) == "gpuctld bridge"
    assert bridge_command("sudo -n '/opt/my gpuctld'", "/run/a b.sock") == (
        "sudo -n '/opt/my gpuctld' bridge --socket '/run/a b.sock'"
    )
    with pytest.raises(ValueError):
        bridge_command("'unbalanced", None)


def test_transport_error_helper_names_node():
    err = transport_error("gpu01", httpx.ReadTimeout("x"), address="10.0.0.5:22", timeout_s=5.0)
    assert str(err) == "node gpu01 (10.0.0.5:22): timed out after 5 s waiting for gpuctld's answer"
    assert err.code == "timeout"
    refused = transport_error("gpu01", ConnectionRefusedError(111, "Connection refused"), address="h:22")
    assert str(refused) == "node gpu01 (h:22): connection refused"
    same = TransportError("gpu01", "x")
    assert transport_error("other", same) is same
    assert str(transport_error("n", ValueError("odd"))) == "node n: ValueError: odd"


def test_open_transport_chooses_and_rejects():
    assert isinstance(open_transport(node(transport="local", socket="/tmp/x.sock")), LocalTransport)
    with pytest.raises(TransportError) as info:
        open_transport(node(transport="telnet"))
    assert str(info.value) == "node n1: unknown transport 'telnet' (expected 'ssh' or 'local')"


# --------------------------------------------------------------------------- local transport


class _Health(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        body = json.dumps({"ok": True, "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

    def address_string(self):
        return "unix"


def test_local_transport_health_and_missing_socket(tmp_path):
    sock = str(tmp_path / "d.sock")
    server = socketserver.ThreadingUnixStreamServer(sock, _Health)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    t = LocalTransport("n1", sock, timeout_s=2.0)
    try:
        assert t.http_client().get("/v1/health").json() == {"ok": True, "path": "/v1/health"}
        assert t.http_client() is t.http_client()
    finally:
        t.close()
        server.shutdown()
        server.server_close()
    missing = str(tmp_path / "gone.sock")
    t = LocalTransport("n1", missing, timeout_s=2.0)
    with pytest.raises(TransportError) as info:
        t.http_client().get("/v1/health")
    assert str(info.value) == f"node n1: gpuctld is not running on this node: no socket at {missing}"
    assert info.value.code == "daemon"
    t.close()
