"""Security review of the SSH transport (gpuctl/transport/ssh.py) against a real sshd: a server
key of a type known_hosts does not list for a host that *is* known (another type) is a possible
man-in-the-middle offering only the type it has, so --accept-new-host-key must not add it; the
socket path and daemon command reach the exec channel shell-quoted (no command injection).
"""

from __future__ import annotations


import pytest

from sshd import Node, keygen, sshd_available
from tests.support.transport import expect_transport_error as _fail


pytestmark = [
    pytest.mark.sshd,
    pytest.mark.skipif(not sshd_available(), reason="needs /usr/sbin/sshd and ssh-keygen"),
]


def test_accept_new_does_not_add_a_key_of_another_type_for_a_known_host(sshd, opened, tmp_path):
    keygen(tmp_path / "rsa_host_key", key_type="rsa")
    key_type, key_b64 = (tmp_path / "rsa_host_key.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    before = f"[127.0.0.1]:{sshd.port} {key_type} {key_b64}\n"
    known.write_text(before)
    err = _fail(opened(Node(name="gpu01", host="test-sshd"), known_hosts_path=str(known),
                       accept_new_host_key=True))
    assert err.code == "host_key_changed"
    assert f"{known}:1" in str(err) and "ssh-rsa" in str(err) and "man-in-the-middle" in str(err)
    assert known.read_text() == before


def test_hostile_socket_path_is_one_quoted_word_on_the_node(sshd, opened, tmp_path):
    marker = tmp_path / "pwned"
    hostile = f"/nonexistent/s.sock'; touch {marker}; echo '$(touch {marker})`touch {marker}`"
    err = _fail(opened(Node(name="gpu01", host="test-sshd", socket=hostile)))
    assert err.code == "daemon"
    assert f"no socket at {hostile}" in str(err)
    assert not marker.exists()
