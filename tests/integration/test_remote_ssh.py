"""The data path through the node's SSH connection (a real sshd from tests/sshd.py): the ssh://
form of GPUCTL_ATTACH, attach(ssh=transport), and its refusals (unknown host key, no worker)."""

from __future__ import annotations

import os
import sys

import numpy as np
import paramiko
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "support"))

import gpuctl.remote as cp  # noqa: E402
from gpuctl.datapath.testing import running_worker  # noqa: E402
from gpuctl.remote._connection import AttachError, Connection, parse_attach  # noqa: E402
from sshd import free_port, sshd_available  # noqa: E402

pytestmark = pytest.mark.skipif(not sshd_available(), reason="needs /usr/sbin/sshd and ssh-keygen")


@pytest.fixture(scope="module")
def worker():
    with running_worker() as (handle, url):
        yield handle, url


def _ssh_url(sshd, url, **extra):
    spec = parse_attach(url)
    query = {"lease": spec.lease_id, "token": spec.token.hex(), "known_hosts": str(sshd.known_hosts),
             "identity": str(sshd.user_key), **extra}
    q = "&".join(f"{k}={v}" for k, v in query.items())
    return f"ssh://{sshd.user}@127.0.0.1:{sshd.port}/{spec.host}:{spec.port}?{q}"


def test_parse_ssh_url():
    spec = parse_attach("ssh://alice@node7:2222/127.0.0.1:40001?lease=L1&token=0a0b&known_hosts=/k&identity=/i")
    assert (spec.ssh_user, spec.ssh_host, spec.ssh_port, spec.host, spec.port) == ("alice", "node7", 2222,
                                                                                 "127.0.0.1", 40001)
    assert (spec.lease_id, spec.token, spec.known_hosts, spec.identity, spec.tls) == ("L1", b"\n\x0b", "/k", "/i", False)
    spec = parse_attach("ssh://node7/[::1]:5?lease=L&token=00")
    assert (spec.ssh_user, spec.ssh_port, spec.host, spec.port) == (None, 22, "::1", 5)


@pytest.mark.parametrize(
    "value, message",
    [
        ("ssh:///127.0.0.1:5?lease=L&token=00", r"GPUCTL_ATTACH: expected \[USER@\]NODE\[:SSHPORT\] after ssh://"),
        ("ssh://node?lease=L&token=00", r"GPUCTL_ATTACH: expected /HOST:PORT of the worker .* got ''"),
        ("ssh://node/127.0.0.1:0?lease=L&token=00", r"expected /HOST:PORT of the worker .* got '/127.0.0.1:0'"),
        ("ssh://node/127.0.0.1:5?token=00", "GPUCTL_ATTACH: missing lease=ID"),
    ],
)
def test_ssh_url_errors(value, message):
    with pytest.raises(AttachError, match=message):
        parse_attach(value)


def test_ops_through_ssh_url(sshd, worker):
    handle, url = worker
    conn = cp.attach(_ssh_url(sshd, url))
    try:
        assert conn.endpoint.endswith("via ssh") and conn.executor == "numpy"
        big = np.arange(100_000, dtype=np.float64)  # 800 kB: many SSH packets each way
        x = cp.asarray(big)
        y = x * 2 + 1
        np.testing.assert_array_equal(y.get(), big * 2 + 1)
        assert float(y.sum()) == float((big * 2 + 1).sum())
        z = cp.zeros(1024, dtype=cp.float32)
        for _ in range(100):
            z += 1
        assert float(z[7]) == 100.0
        with pytest.raises(ValueError, match=r"matmul: Input operand 1 has a mismatch"):  # at the call
            cp.ones((2, 3)) @ cp.ones((2, 3))
        with pytest.raises(IndexError, match=r"op #\d+ getitem\(h\d+, h\d+\): index 5 is out of bounds"):
            cp.arange(3)[cp.asarray(np.array([5]))].get()  # the worker's error, through the SSH channel
        assert float(cp.ones(3).sum()) == 3.0  # the connection goes on after an op error
    finally:
        cp.detach()
    assert handle.alive()


def test_attach_with_callers_transport(sshd, worker):
    _, url = worker
    client = paramiko.SSHClient()
    client.load_host_keys(str(sshd.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect("127.0.0.1", port=sshd.port, username=sshd.user, key_filename=str(sshd.user_key),
                   look_for_keys=False, allow_agent=False)
    try:
        conn = cp.attach(url, ssh=client.get_transport())
        assert float(cp.arange(5).sum()) == 10.0
        cp.detach()
        assert conn.lost and client.get_transport().is_active()  # the caller's SSH connection stays open
        conn = Connection(parse_attach(url), ssh=client)  # an SSHClient works too
        h = conn.upload(np.arange(3.0))
        assert conn.get(h).tolist() == [0.0, 1.0, 2.0]
        conn.close()
    finally:
        client.close()


def test_unknown_host_key_refused(sshd, worker, tmp_path):
    _, url = worker
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(AttachError, match=rf"ssh {sshd.user}@127.0.0.1:{sshd.port}: unknown host key .*refused"):
        Connection(parse_attach(_ssh_url(sshd, url, known_hosts=str(empty))))
    with pytest.raises(AttachError, match="known_hosts file /nonexistent/kh does not exist"):
        Connection(parse_attach(_ssh_url(sshd, url, known_hosts="/nonexistent/kh")))


def test_no_worker_behind_the_channel(sshd, worker):
    _, url = worker
    spec = parse_attach(url)
    dead = url.replace(f":{spec.port}?", f":{free_port()}?")
    with pytest.raises(AttachError, match=rf"the node's sshd could not reach the worker of lease {spec.lease_id} "
                                          r"at 127.0.0.1:\d+: .*is the worker running"):
        Connection(parse_attach(_ssh_url(sshd, dead)))


def test_wrong_token_through_ssh_refused(sshd, worker):
    _, url = worker
    spec = parse_attach(url)
    bad = url.replace(spec.token.hex(), "00" * len(spec.token))
    with pytest.raises(AttachError, match=f"refused lease {spec.lease_id}: hello: lease token refused"):
        Connection(parse_attach(_ssh_url(sshd, bad)))


def test_tls_and_ssh_cannot_be_combined(worker):
    _, url = worker
    with pytest.raises(AttachError, match="tls:// and an SSH connection cannot be combined"):
        Connection(parse_attach(url.replace("tcp://", "tls://")), ssh=object())
