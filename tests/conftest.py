"""Fixtures shared by tests/unit, tests/integration and tests/console (each defined once here);
helpers live in the tests/support package."""

from __future__ import annotations

import pytest

from tests.support.daemon_proc import REPO_ROOT
from tests.support.sshd import SshServer

from gpuctl.transport import open_transport


@pytest.fixture(scope="module")
def sshd():
    """A real OpenSSH sshd on 127.0.0.1 for the module (tests/support/sshd.py); its sessions find
    this checkout's gpuctl (PYTHONPATH). Modules that need sshd skip themselves without it."""
    with SshServer(session_env={"PYTHONPATH": str(REPO_ROOT)}) as server:
        yield server


@pytest.fixture
def opened(sshd):
    """`opened(node, server=sshd, **options)` opens a transport to `node` through `server`'s
    ssh_config and known_hosts (no agent); every transport opened is closed after the test."""
    transports = []

    def _open(node, server=None, **options):
        server = server or sshd
        options.setdefault("ssh_config_path", str(server.ssh_config))
        options.setdefault("known_hosts_path", str(server.known_hosts))
        options.setdefault("use_agent", False)
        t = open_transport(node, **options)
        transports.append(t)
        return t

    yield _open
    for t in transports:
        t.close()


@pytest.fixture
def source():
    """The console tests' simulated fleet: 4 nodes x 8 GPUs, seed 0 (gpuctl.fleet.simulated)."""
    from gpuctl.fleet.simulated import SimulatedFleetSource

    src = SimulatedFleetSource(nodes=4, gpus_per_node=8, seed=0)
    try:
        yield src
    finally:
        src.close()
