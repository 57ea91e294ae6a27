"""A one-shot `gpuctl` verb freezes its heap before the fan-out (gpuctl.cli.context.open_fleet):
only when this process is the command itself, never for main() called with arguments, nor for
the console; the SSH transport is imported before the fan-out."""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuctl.cli.context import open_fleet
from gpuctl.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
CONFIG = b'''
[[node]]
name = "n1"
host = "example.invalid"
'''


@pytest.fixture()
def cfg():
    return parse_config(CONFIG, "fleet.toml")


@pytest.fixture(autouse=True)
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.mark.parametrize("verb, entry", [("status", False), ("console", True), (None, True), ("demo", True)])
def test_heap_left_alone(cfg, verb, entry):
    fleet = open_fleet(argparse.Namespace(verb=verb, process_entry=entry), cfg)
    try:
        assert gc.get_freeze_count() == 0
    finally:
        fleet.close()


def test_one_shot_command_freezes_after_importing_its_transport(cfg):
    fleet = open_fleet(argparse.Namespace(verb="status", process_entry=True), cfg)
    try:
        assert gc.get_freeze_count() > 1000
        assert "gpuctl.transport.ssh" in sys.modules and "paramiko" in sys.modules
    finally:
        fleet.close()


def test_the_command_process_sets_process_entry(tmp_path):
    """`python -m gpuctl.cli` runs main() with no arguments: the heap is frozen for the fan-out
    (the node is unreachable: exit status for a node down, the JSON still written)."""
    (tmp_path / "fleet.toml").write_bytes(CONFIG + b'timeout_s = 1.0\n')
    code = ("import gc, runpy, sys, atexit\n"
            "atexit.register(lambda: sys.stderr.write(f'frozen={gc.get_freeze_count()}\\n'))\n"
            "sys.argv = ['gpuctl', '--config', sys.argv[1], 'status', '--json']\n"
            "runpy.run_module('gpuctl.cli', run_name='__main__')\n")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "fleet.toml")], capture_output=True,
                       text=True, timeout=60, cwd=str(ROOT), stdin=subprocess.DEVNULL)
    frozen = [ln for ln in p.stderr.splitlines() if ln.startswith("frozen=")]
    assert frozen and int(frozen[-1].split("=")[1]) > 1000, p.stderr[-2000:]
    assert '"reachable": false' in p.stdout


def _run_gpuctl(tmp_path, args, *, process_entry: bool, block_paramiko: bool = False):
    """`gpuctl ARGS` in a fresh interpreter: as the command itself (process_entry: sys.argv, the
    fan-out preloads and freezes) or through main(ARGS) (no preload); paramiko made unimportable
    when asked (sys.modules entry None: ImportError on import)."""
    code = ("import runpy, sys\n"
            f"if {block_paramiko!r}: sys.modules['paramiko'] = None\n"
            "args = sys.argv[1:]\n"
            f"if {process_entry!r}:\n"
            "    sys.argv = ['gpuctl', *args]\n"
            "    runpy.run_module('gpuctl.cli', run_name='__main__')\n"
            "from gpuctl.cli import main\n"
            "raise SystemExit(main(args))\n")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
                          cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": str(ROOT)},
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("entry", [True, False])
def test_a_transport_that_fails_to_import_is_a_node_error_either_way(tmp_path, entry):
    """paramiko cannot be imported: the one-shot command's preload leaves it to the fan-out, which
    names the node (exit 7 UNREACHABLE, as through main(argv)); before, the preload raised out of
    open_fleet: exit 1 'internal error: ModuleNotFoundError', no node named."""
    (tmp_path / "fleet.toml").write_bytes(CONFIG + b'timeout_s = 1.0\n')
    p = _run_gpuctl(tmp_path, ["--config", "fleet.toml", "status"], process_entry=entry, block_paramiko=True)
    assert p.returncode == 7, p.stderr[-2000:]
    assert "gpuctl: unreachable: node n1: import of paramiko halted" in p.stderr
    assert "internal error" not in p.stderr


def test_a_bad_ssh_config_is_named_with_file_and_line_on_the_frozen_path(tmp_path):
    (tmp_path / "fleet.toml").write_bytes(CONFIG + b'timeout_s = 1.0\n')
    (tmp_path / "ssh_config").write_text("Host *\n  Port notaport\n")
    args = ["--config", "fleet.toml", "status", "--json", "--ssh-config", "ssh_config"]
    p = _run_gpuctl(tmp_path, args, process_entry=True)
    assert p.returncode == 7, p.stderr[-2000:]
    assert "node n1 (example.invalid): ssh_config:2: Port 'notaport' is not a number" in p.stderr
    assert '"reachable": false' in p.stdout and "ssh_config:2" in p.stdout
    assert (tmp_path / "ssh_config").read_text() == "Host *\n  Port notaport\n"


def test_preload_raises_nothing_when_a_module_fails_to_import(cfg, monkeypatch):
    from gpuctl.fleet import client

    monkeypatch.setitem(sys.modules, "gpuctl.transport.ssh", None)
    client.preload_transports(cfg)  # no ImportError: left to the fan-out
    assert sys.modules["gpuctl.transport.ssh"] is None
