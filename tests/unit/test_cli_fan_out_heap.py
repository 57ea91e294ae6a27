"""A one-shot `gpuctl` verb freezes its heap before the fan-out (gpuctl.cli.context.open_fleet):
only when this process is the command itself, never for main() called with arguments, nor for
the console; the SSH transport is imported before the fan-out."""

from __future__ import annotations

import argparse
import gc
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
