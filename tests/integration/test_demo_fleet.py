"""`gpuctl demo --no-console`: run from any directory, survives a killed node, restarts it, and
removes everything it created on exit (issue 9 items 18, 19)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fleet_fixtures import run_cli
from test_installed_package import _clean_env, _script


def _start_demo(cwd: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, dict]:
    """`gpuctl demo --no-console --json --nodes 2 --gpus 2` from `cwd` with the installed console
    script and no PYTHONPATH; returns (process, its JSON line)."""
    p = subprocess.Popen([str(_script("gpuctl")), "demo", "--no-console", "--json", "--nodes", "2", "--gpus", "2",
                          *extra], cwd=cwd, env=env or _clean_env(), stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line:
        p.wait(30)
        raise AssertionError(f"demo exited {p.returncode}: {p.stderr.read()}")
    return p, json.loads(line)


def _stop(p: subprocess.Popen) -> str:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(10)
    return p.stderr.read()


def _reachable(cfg: str) -> dict[str, bool]:
    r = run_cli("--config", cfg, "--json", "status", timeout_s=30)
    return {n["name"]: n["reachable"] for n in r.json["nodes"]}


def _wait(pred, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_demo_runs_from_the_parent_folder_of_a_clone_named_gpuctl(tmp_path):
    # Before: the daemons ran `python -m gpuctl.daemon` in this directory, where ./gpuctl (the
    # clone, no __init__.py) became a namespace package that shadowed the editable install.
    clone = tmp_path / "gpuctl"
    (clone / "gpuctl").mkdir(parents=True)
    (clone / "pyproject.toml").write_text("[project]\nname = 'gpuctl'\n")
    probe = subprocess.run([sys.executable, "-c", "from gpuctl import __version__"], cwd=tmp_path,
                           env=_clean_env(), capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0 and "cannot import name '__version__'" in probe.stderr  # the trap is real
    p, info = _start_demo(tmp_path)
    try:
        assert _reachable(info["config"]) == {"sim-01": True, "sim-02": True}
    finally:
        _stop(p)


def test_killed_node_leaves_the_demo_running_and_comes_back(tmp_path):
    p, info = _start_demo(tmp_path)
    cfg = info["config"]
    root = Path(cfg).parent
    try:
        # a lease: its worker's run directory must land in the demo's directory, not in /tmp
        r = run_cli("--config", cfg, "--json", "lease", "--dept", "research", "--slices", "1", "--node", "sim-01")
        assert r.code == 0, r.stderr
        assert list((root / "tmp").glob(f"gpuctl-lease-{r.json['lease']['id']}-*"))
        os.kill(info["pids"][0], signal.SIGKILL)
        time.sleep(1.5)
        assert p.poll() is None, "the demo ended when one node died"
        assert _reachable(cfg) == {"sim-01": False, "sim-02": True}
        p.send_signal(signal.SIGUSR1)
        _wait(lambda: _reachable(cfg) == {"sim-01": True, "sim-02": True}, 30, "sim-01 back after SIGUSR1")
        owners = run_cli("--config", cfg, "--json", "departments").json
        assert any(d["name"] == "research" and d["gpu_equivalents"] > 0 for d in owners["departments"])
    finally:
        err = _stop(p)
    assert p.returncode == 0
    assert "node sim-01 is down (gpuctld exited with -9); the demo goes on without it" in err
    assert not root.exists(), "the demo left its directory (config, state, lease directories)"


def test_restart_after_brings_a_dead_node_back_by_itself(tmp_path):
    p, info = _start_demo(tmp_path, "--restart-after", "1")
    try:
        os.kill(info["pids"][1], signal.SIGKILL)
        _wait(lambda: _reachable(info["config"]) == {"sim-01": True, "sim-02": True}, 30, "sim-02 restarted")
    finally:
        err = _stop(p)
    assert "node sim-02 is down" in err and "restart in 1 s" in err and "node sim-02 is back" in err


def test_restart_after_needs_no_console():
    r = run_cli("demo", "--restart-after", "5")
    assert r.code == 2 and "--restart-after: only with --no-console" in r.stderr


def test_restart_from_a_short_lived_thread_keeps_the_daemon(tmp_path, monkeypatch):
    # The console restarts a node from a worker thread that ends at once; PR_SET_PDEATHSIG follows
    # the forking *thread*, so a daemon forked there would be SIGTERM'd as soon as it ended.
    import threading

    from gpuctl.fleet.demo import current_demo, demo_fleet

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert current_demo() is None
    with demo_fleet(nodes=1, gpus=1, seed=4) as fleet:
        assert current_demo() is fleet
        n = fleet.node("sim-01")
        n.proc.kill()
        n.proc.wait()
        assert [d.name for d in fleet.dead()] == ["sim-01"]
        t = threading.Thread(target=lambda: current_demo().restart("sim-01"))
        t.start()
        t.join(30)
        time.sleep(1.0)
        assert n.alive and fleet.dead() == []
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(n.socket)), base_url="http://gpuctld") as c:
            assert c.get("/v1/health").status_code == 200
        with pytest.raises(KeyError, match="no demo node 'sim-09'"):
            fleet.restart("sim-09")
        root = fleet.root
    assert current_demo() is None and not root.exists()
