"""`gpuctl lease | leases | release | run` end to end against the demo fleet (real simulated gpuctld
processes laid out by gpuctl.fleet.demo, local transport, NumPy executor)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from daemon_proc import REPO_ROOT, uds_client
from fleet_fixtures import cli_process, daemon_slices, run_cli, ssh_cli_args, sshd_node, write_fleet_config
from gpuctl.backends.simulated import MEMORY_TOTAL_BYTES
from gpuctl.fleet.demo import start_demo_fleet


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """Two demo nodes x 8 GPUs (sim-01: research owns GPUs 0-2 and half of GPU 6; sim-02: GPU 6 in
    quarters, one of them research's)."""
    fleet = start_demo_fleet(nodes=2, gpus=8, seed=0, root=tmp_path_factory.mktemp("demo"))
    try:
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture
def cfg(demo):
    """The demo's config path; after each test, asserts no lease is left and ends any that is."""
    yield str(demo.config_path)
    left = []
    for n in demo.nodes:
        with uds_client(n.socket) as c:
            for lease in c.get("/v1/leases").json()["leases"]:
                left.append(lease["id"])
                c.delete(f"/v1/leases/{lease['id']}")
    assert left == [], f"leases left behind: {left}"


def leases_of(demo) -> dict[str, list[dict]]:
    out = {}
    for n in demo.nodes:
        with uds_client(n.socket) as c:
            out[n.name] = c.get("/v1/leases").json()["leases"]
    return out


def quarter_of_research(demo) -> str:
    """The id of research's 1/4 slice on sim-02 (GPU 6)."""
    found = [s for s in daemon_slices(demo.nodes[1].socket).values()
             if s["department"] == "research" and s["fraction"] == 0.25]
    assert len(found) == 1
    return found[0]["id"]


def test_lease_leases_release(demo, cfg):
    r = run_cli("--config", cfg, "lease", "--dept", "research", "--gpus", "0.25", "--json")
    assert r.code == 0, r.stderr
    doc = r.json
    # best fit across the fleet: the one idle 1/4 slice of research (sim-02), not a whole GPU
    assert doc["node"] == "sim-02" and doc["lease"]["slice_ids"] == [quarter_of_research(demo)]
    assert doc["gpu_index"] == 6 and len(doc["token"]) == 64
    assert doc["attach"] == f"tcp://{doc['endpoint']}?lease={doc['lease']['id']}&token={doc['token']}"
    lid = doc["lease"]["id"]
    status = run_cli("--config", cfg, "status", "--json", "--node", "sim-02").json
    leased = {s["id"]: s["lease_id"] for g in status["nodes"][0]["gpus"] for s in g["slices"] if s["leased"]}
    assert leased == {quarter_of_research(demo): lid}

    plain = run_cli("--config", cfg, "lease", "--dept", "research", "--slices", "1", "--node", "sim-01")
    assert plain.code == 0, plain.stderr
    lines = dict(line.split(None, 1) for line in plain.stdout.splitlines())
    assert lines["node"] == "sim-01" and lines["department"] == "research"
    assert lines["lease"].startswith("lease-") and "token" not in plain.stdout
    assert "shown with --json only" in plain.stderr

    listed = run_cli("--config", cfg, "leases", "--json")
    assert listed.code == 0, listed.stderr
    assert sorted((x["node"], x["id"]) for x in listed.json["leases"]) == sorted(
        [("sim-02", lid), ("sim-01", lines["lease"])])
    assert listed.json["unreachable_nodes"] == []

    ttl_before = next(x for x in listed.json["leases"] if x["id"] == lid)["expires_s"]
    renew = run_cli("--config", cfg, "renew", lid, "--json")
    assert renew.code == 0, renew.stderr
    assert renew.json["node"] == "sim-02" and renew.json["lease_id"] == lid
    assert renew.json["expires_s"] > ttl_before
    plain_renew = run_cli("--config", cfg, "renew", lines["lease"])
    assert plain_renew.code == 0 and plain_renew.stdout.startswith(f"renewed {lines['lease']} on sim-01: expires in ")

    for node, lease_id in (("sim-02", lid), ("sim-01", lines["lease"])):
        rel = run_cli("--config", cfg, "release", lease_id)
        assert rel.code == 0, rel.stderr
        assert rel.stdout.strip() == f"released {lease_id} on {node}: 1 slice(s) free"
    assert leases_of(demo) == {"sim-01": [], "sim-02": []}
    again = run_cli("--config", cfg, "release", lid)
    assert again.code == 4 and f"no lease {lid!r} on any reachable node" in again.stderr
    gone = run_cli("--config", cfg, "renew", lid)
    assert gone.code == 4 and f"no lease {lid!r} on any reachable node" in gone.stderr


def test_lease_refusals_change_nothing(demo, cfg):
    before = [daemon_slices(n.socket) for n in demo.nodes]
    r = run_cli("--config", cfg, "lease", "--dept", "training", "--slices", "3")
    assert r.code == 4, r.stderr
    assert "no node has free slices of 'training' covering 3 slice(s) on one GPU" in r.stderr
    assert "sim-02: GPU 0: 1, GPU 1: 1, GPU 2: 1, GPU 3: 1, GPU 6: 1/4" in r.stderr
    assert r.stdout == ""
    for args, words in ((("--dept", "marketing", "--gpus", "1"), "--dept: unknown department 'marketing'"),
                        (("--dept", "research", "--gpus", "1.5"), "--gpus: gpus must be > 0 and <= 1"),
                        (("--dept", "research", "--gpus", "1", "--node", "x"), "--node: unknown node 'x'")):
        u = run_cli("--config", cfg, "lease", *args)
        assert u.code == 2 and words in u.stderr, u.stderr
    assert [daemon_slices(n.socket) for n in demo.nodes] == before


SCRIPT = textwrap.dedent("""
    import os, sys
    import gpuctl.remote as cp
    a = cp.arange(6, dtype=cp.float64).reshape(2, 3)
    free, total = cp.cuda.runtime.memGetInfo()
    print("result", float((a @ a.T).sum().get()), "quota", total, "lease", os.environ["GPUCTL_ATTACH"].split("lease=")[1].split("&")[0])
    sys.exit(int(sys.argv[1]))
""")


@pytest.mark.parametrize("exit_code", [0, 3])
def test_run_returns_command_exit_code_and_releases(demo, cfg, exit_code):
    r = run_cli("--config", cfg, "run", "--dept", "research", "--gpus", "0.25", "--",
                sys.executable, "-c", SCRIPT, str(exit_code))
    assert r.code == exit_code, r.stderr
    words = r.stdout.split()
    assert words[:2] == ["result", "83.0"]  # [[0,1,2],[3,4,5]] @ its transpose: 5+14+14+50
    lid = words[5]
    # memGetInfo answers for the 1/4 slice: its quota, or the node's host-memory cap of NumPy leases
    # (then said on stderr)
    cut = re.search(rf"lease {lid}: the NumPy executor holds arrays in host memory: quota cut from "
                    rf"{MEMORY_TOTAL_BYTES // 4} to (\d+) bytes", r.stderr)
    assert int(words[3]) == (int(cut.group(1)) if cut else MEMORY_TOTAL_BYTES // 4)
    assert f"lease {lid} on sim-02" in r.stderr and f"released lease {lid} on sim-02" in r.stderr
    assert leases_of(demo) == {"sim-01": [], "sim-02": []}


def test_run_heartbeats_past_the_ttl(demo, cfg):
    script = ("import time, gpuctl.remote as cp; time.sleep(2.2); "
              "print('sum', float(cp.ones(4).sum().get()))")
    r = run_cli("--config", cfg, "run", "--dept", "research", "--gpus", "0.25", "--ttl", "1", "--",
                sys.executable, "-c", script)
    assert r.code == 0, r.stderr
    assert r.stdout.strip() == "sum 4.0"
    assert "ended" not in r.stderr  # the heartbeat thread never lost the lease


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_run_forwards_signal_then_releases(demo, cfg, sig):
    script = textwrap.dedent(f"""
        import signal, sys, time
        import gpuctl.remote as cp
        x = cp.ones(8)
        def on_signal(signum, frame):
            print("got", signal.Signals(signum).name + ", sum", float(x.sum().get()), flush=True)
            sys.exit(42)
        signal.signal({int(sig)}, on_signal)
        print("ready", flush=True)
        time.sleep(30)
    """)
    with cli_process("--config", cfg, "run", "--dept", "research", "--gpus", "0.25", "--",
                     sys.executable, "-c", script) as p:
        assert p.stdout.readline().strip() == "ready"
        assert len(leases_of(demo)["sim-02"]) == 1
        p.send_signal(sig)  # gpuctl's stdin is no terminal: the signal did not reach CMD by itself
        out, err = p.communicate(timeout=20)
    assert p.returncode == 42, err
    assert out.strip() == f"got {sig.name}, sum 8.0"  # the lease was still there while CMD handled it
    assert "released lease" in err
    assert leases_of(demo) == {"sim-01": [], "sim-02": []}


def test_run_usage_and_missing_command(demo, cfg):
    r = run_cli("--config", cfg, "run", "--dept", "research", "--gpus", "0.25")
    assert r.code == 2 and "give the command after --" in r.stderr
    r = run_cli("--config", cfg, "run", "--dept", "research", "--gpus", "0.25", "--", "no-such-command-xyz")
    assert r.code == 127 and "cannot start 'no-such-command-xyz'" in r.stderr
    assert "released lease" in r.stderr
    assert leases_of(demo) == {"sim-01": [], "sim-02": []}


def test_mlp_train_through_run_matches_local_numpy(demo, cfg):
    example = REPO_ROOT / "examples" / "mlp_train.py"
    if not example.exists():
        pytest.skip("examples/mlp_train.py is not there yet")
    r = run_cli("--config", cfg, "run", "--dept", "research", "--gpus", "0.25", "--",
                sys.executable, str(example), "--epochs", "5", "--json", timeout_s=120)
    assert r.code == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("epoch 1 loss ") and len(lines) == 6
    remote = json.loads(lines[-1])
    assert remote["backend"] == "gpuctl.remote"
    env = {k: v for k, v in os.environ.items() if k != "GPUCTL_ATTACH"}
    local = json.loads(subprocess.run([sys.executable, str(example), "--epochs", "5", "--json"], env=env,
                                      capture_output=True, text=True, check=True, cwd=REPO_ROOT).stdout
                       .strip().splitlines()[-1])
    assert local["backend"] == "numpy"
    np.testing.assert_allclose(remote["loss"], local["loss"], rtol=1e-5)
    assert remote["loss"][-1] < remote["loss"][0]  # it trains
    assert leases_of(demo) == {"sim-01": [], "sim-02": []}


@pytest.mark.sshd
def test_run_over_ssh_leases_through_sshd(tmp_path):
    """The lease is granted, heartbeated and released through a real sshd (`gpuctld bridge`)."""
    from daemon_proc import start_daemon
    from sshd import SshServer, sshd_available

    if not sshd_available():
        pytest.skip("needs /usr/sbin/sshd and ssh-keygen")
    d = start_daemon(tmp_path, gpus=2, seed=5, name="alpha", extra_args=["--log-level", "debug"])  # heartbeats: DEBUG
    try:
        with uds_client(d.socket_path) as c:
            gen = c.get("/v1/slices").json()["generation"]
            sid = sorted(daemon_slices(d.socket_path))[0]
            assert c.post("/v1/assign", json={"request_id": "s", "generation": gen, "moves": [
                {"slice_id": sid, "from": "unassigned", "to": "research"}]}).status_code == 200
        with SshServer(session_env={"PYTHONPATH": str(REPO_ROOT)}) as sshd:
            cfg = write_fleet_config(tmp_path / "fleet.toml", {"alpha": sshd_node(d.socket_path)}, departments={})
            r = run_cli(*ssh_cli_args(cfg, sshd), "run", "--dept", "research", "--gpus", "1", "--ttl", "1", "--",
                        sys.executable, "-c", "import time, gpuctl.remote as cp; time.sleep(1.5); "
                        "print(float((cp.arange(5) ** 2).sum().get()))")
        assert r.code == 0, r.stderr
        assert r.stdout.strip() == "30.0"
        assert "lease lease-" in r.stderr and "on alpha" in r.stderr and "released lease" in r.stderr
        with uds_client(d.socket_path) as c:
            assert c.get("/v1/leases").json()["leases"] == []
        assert "POST /v1/leases/" in d.stderr_text() and "/heartbeat" in d.stderr_text()
    finally:
        d.stop()


def test_run_releases_and_stops_cmd_when_gpuctl_itself_fails(demo, cfg, monkeypatch, capsys):
    """A crash inside gpuctl while CMD runs: CMD is terminated and the lease released (finally)."""
    import gpuctl.cli.leases as leases_cli
    from gpuctl.cli import main

    started: list[subprocess.Popen] = []

    class FailingWait(subprocess.Popen):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            started.append(self)

        def wait(self, timeout=None):
            if timeout is None:  # gpuctl's own wait for CMD
                assert len(leases_of(demo)["sim-02"]) == 1
                raise RuntimeError("simulated crash in gpuctl")
            return super().wait(timeout)

    monkeypatch.setattr(leases_cli.subprocess, "Popen", FailingWait)
    code = main(["--config", cfg, "run", "--dept", "research", "--gpus", "0.25", "--",
                 sys.executable, "-c", "import time; time.sleep(30)"])
    err = capsys.readouterr().err
    assert code == 1 and "internal error: RuntimeError: simulated crash in gpuctl" in err
    assert started and started[0].returncode == -signal.SIGTERM  # CMD did not outlive gpuctl's lease
    assert "released lease" in err
    assert leases_of(demo) == {"sim-01": [], "sim-02": []}
