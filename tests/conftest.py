"""Fixtures shared by tests/unit, tests/integration and tests/console (each defined once here);
helpers live in the tests/support package."""

from __future__ import annotations

import pytest

from tests.support.daemon_proc import REPO_ROOT
from tests.support.sshd import SshServer


@pytest.fixture(scope="module")
def sshd():
    """A real OpenSSH sshd on 127.0.0.1 for the module (tests/support/sshd.py); its sessions find
    this checkout's gpuctl (PYTHONPATH). Modules that need sshd skip themselves without it."""
    with SshServer(session_env={"PYTHONPATH": str(REPO_ROOT)}) as server:
        yield server
