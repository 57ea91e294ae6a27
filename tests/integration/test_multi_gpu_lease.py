"""Issue 17 item 1, the parts that need no torch: a native lease of several whole GPUs (one per
node of a job), its refusals, the all-or-nothing grant across nodes (a node that refuses after
the placement leaves nothing held), and a job on two GPUs of one node (CUDA_VISIBLE_DEVICES lists
both UUIDs, NPROC_PER_NODE=2). Real simulated gpuctld daemons, local transport."""

from __future__ import annotations

import json
import re
import sys

import pytest

from daemon_proc import start_daemon, uds_client
from fleet_fixtures import daemon_slices, run_cli


def _give(sock, gpus: list[int], split: int | None = None) -> list[str]:
    """Assign GPUs (by position) to research, GPU `split` in halves first; returns every GPU UUID."""
    with uds_client(sock) as c:
        st = c.get("/v1/status").json()
        uuids = [g["identity"]["uuid"] for g in st["gpus"]]
        gen = st["generation"]
        if split is not None:
            r = c.post("/v1/split", json={"request_id": "split", "generation": gen, "gpu_uuid": uuids[split],
                                          "parts": 2})
            assert r.status_code == 200, r.text
            gen = r.json()["generation"]
        want = {uuids[i] for i in gpus}
        moves = [{"slice_id": s["id"], "from": "unassigned", "to": "research"}
                 for s in daemon_slices(sock).values() if s["gpu_uuid"] in want]
        r = c.post("/v1/assign", json={"request_id": "give", "generation": gen, "moves": moves})
        assert r.status_code == 200, r.text
    return uuids


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """n1 (4 GPUs: 0, 1, 2 research's, 2 in halves) and n2 (2 GPUs: 0 research's), both local."""
    tmp = tmp_path_factory.mktemp("mgl")
    d1 = start_daemon(tmp, gpus=4, seed=21, name="n1")
    d2 = start_daemon(tmp, gpus=2, seed=22, name="n2")
    try:
        u1 = _give(d1.socket_path, [0, 1, 2], split=2)
        u2 = _give(d2.socket_path, [0])
        cfg = tmp / "fleet.toml"
        cfg.write_text(f'[[node]]\nname = "n1"\ntransport = "local"\nsocket = "{d1.socket_path}"\n\n'
                       f'[[node]]\nname = "n2"\ntransport = "local"\nsocket = "{d2.socket_path}"\n')
        yield {"d": (d1, d2), "u": (u1, u2), "cfg": str(cfg)}
    finally:
        d1.stop()
        d2.stop()


def _leases(two) -> list[list[dict]]:
    out = []
    for d in two["d"]:
        with uds_client(d.socket_path) as c:
            out.append(c.get("/v1/leases").json()["leases"])
    return out


@pytest.fixture
def clean(two):
    yield
    left = _leases(two)
    for d, ls in zip(two["d"], left):
        with uds_client(d.socket_path) as c:
            for lease in ls:
                c.delete(f"/v1/leases/{lease['id']}")
    assert left == [[], []]


def _whole(sock, uuid: str) -> str:
    return next(s["id"] for s in daemon_slices(sock).values() if s["gpu_uuid"] == uuid and s["fraction"] == 1)


def test_native_lease_of_two_whole_gpus(two, clean):
    d1 = two["d"][0]
    u = two["u"][0]
    sids = [_whole(d1.socket_path, u[1]), _whole(d1.socket_path, u[0])]
    with uds_client(d1.socket_path) as c:
        r = c.post("/v1/leases", json={"request_id": "m1", "department": "research", "owner": "t@h", "ttl_s": 30,
                                       "slice_ids": sids, "attach": "native"})
        a = r.json()
        if "lease" in a:
            c.delete(f"/v1/leases/{a['lease']['id']}")
    assert r.status_code == 201, r.text
    assert a["gpu_uuids"] == [u[1], u[0]] and a["gpu_indices"] == [1, 0]  # the order asked: CUDA's order
    assert a["env"]["CUDA_VISIBLE_DEVICES"] == f"{u[1]},{u[0]}"
    assert not [k for k in a["env"] if k.startswith("CUDA_MPS_")]
    assert a["env"]["GPUCTL_COMPUTE_SHARE"] == "1" and a["data_address"] == "127.0.0.1"
    assert int(a["env"]["GPUCTL_MEMORY_QUOTA_BYTES"]) == a["memory_quota_bytes"]


@pytest.mark.parametrize("attach, half", [("remote", False), ("native", True)], ids=["remote-attach", "a-half"])
def test_multi_gpu_lease_refusals_change_nothing(two, clean, attach, half):
    d1 = two["d"][0]
    u = two["u"][0]
    other = (next(s["id"] for s in daemon_slices(d1.socket_path).values() if s["gpu_uuid"] == u[2])
             if half else _whole(d1.socket_path, u[1]))
    before = daemon_slices(d1.socket_path)
    with uds_client(d1.socket_path) as c:
        r = c.post("/v1/leases", json={"request_id": f"bad-{attach}", "department": "research", "owner": "t@h",
                                       "ttl_s": 30, "slice_ids": [_whole(d1.socket_path, u[0]), other],
                                       "attach": attach})
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["field"] == "slice_ids" and "a lease holds slices of one GPU (only a native lease may hold several " \
                                          "whole GPUs, one slice each)" in e["message"]
    assert daemon_slices(d1.socket_path) == before


def test_all_or_nothing_when_a_node_refuses_after_placement(two, clean):
    """Placement saw n2's GPU idle; another client takes it before the grant: n1's lease (granted
    first) is released and the error names n2 and its refusal."""
    from gpuctl.config import load_config
    from gpuctl.fleet.client import FleetClient, default_transport_factory
    from gpuctl.fleet.job import JobError, acquire_all, place

    d2 = two["d"][1]
    cfg = load_config(two["cfg"])
    fleet = FleetClient(cfg, default_transport_factory())
    lines: list[str] = []
    try:
        placement = place(fleet.snapshot(), "research", 2, per_node=1)
        assert [p.node for p in placement.parts] == ["n1", "n2"]
        with uds_client(d2.socket_path) as c:
            other = c.post("/v1/leases", json={"request_id": "thief", "department": "research", "owner": "x@y",
                                               "ttl_s": 30, "gpus": 1, "attach": "native"}).json()
        try:
            with pytest.raises(JobError) as e:
                acquire_all(fleet, placement, ttl_s=30, owner="t@h", err=lines.append)
        finally:
            with uds_client(d2.socket_path) as c:
                c.delete(f"/v1/leases/{other['lease']['id']}")
    finally:
        fleet.close()
    assert e.value.code == "slice_leased"
    assert str(e.value).startswith("node n2 refused its part (GPU 0): ") and "is already leased" in str(e.value)
    assert "; nothing is held (released lease-" in str(e.value)
    assert len(lines) == 1 and lines[0].startswith("released lease lease-") and lines[0].endswith(" on n1")


def test_job_on_two_gpus_of_one_node(two, clean):
    """--gpus 2: one node (the fewest) holds both; one lease, both UUIDs, NPROC_PER_NODE=2."""
    show = ("import json, os; print(json.dumps([os.environ[k] for k in ('CUDA_VISIBLE_DEVICES', 'NNODES', "
            "'NPROC_PER_NODE', 'NODE_RANK')]))")
    r = run_cli("--config", two["cfg"], "run", "--native", "--dept", "research", "--gpus", "2", "--",
                sys.executable, "-c", show)
    assert r.code == 0, r.stderr
    u = two["u"][0]
    assert r.stdout.startswith("[n1] ") and json.loads(r.stdout[5:]) == [f"{u[0]},{u[1]}", "1", "2", "0"]
    assert r.stderr.count("released lease") == 1


def test_job_exit_status_and_missing_command(two, clean):
    r = run_cli("--config", two["cfg"], "run", "--native", "--dept", "research", "--gpus", "2", "--per-node", "1",
                "--", sys.executable, "-c", "import os, sys; sys.exit(5 if os.environ['NODE_RANK'] == '0' else 0)")
    assert r.code == 5, r.stderr
    assert "n1 (rank 0) ended with exit status 5" in r.stderr and r.stderr.count("released lease") == 2
    r = run_cli("--config", two["cfg"], "run", "--native", "--dept", "research", "--gpus", "2", "--per-node", "1",
                "--", "no-such-command-xyz")
    assert r.code == 127 and "n1: cannot start 'no-such-command-xyz'" in r.stderr, r.stderr
    assert r.stderr.count("released lease") == 2
    r = run_cli("--config", two["cfg"], "run", "--dept", "research", "--gpus", "2", "--", "true")
    assert r.code == 2 and "runs with --native: remote attach leases one GPU" in r.stderr


def test_a_revoked_lease_ends_the_whole_job_with_8(two, clean):
    """n2's slice is taken with --revoke: n2's program is ended by its node, n1's by gpuctl (SIGTERM),
    gpuctl says which lease was revoked and exits 8 (LEASE_REVOKED); both leases are gone."""
    import os
    import subprocess
    import time

    from daemon_proc import REPO_ROOT

    script = ("import os, signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
              "print('ready', os.getpid(), flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-m", "gpuctl.cli", "--config", two["cfg"], "run", "--native", "--dept",
                          "research", "--gpus", "2", "--per-node", "1", "--ttl", "3", "--grace", "2", "--",
                          sys.executable, "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    d2 = two["d"][1]
    sid = _whole(d2.socket_path, two["u"][1][0])
    revoked = False
    try:
        pids = {}
        for _ in range(2):
            node, word, pid = p.stdout.readline().split()
            pids[node] = int(pid)
        assert set(pids) == {"[n1]", "[n2]"}
        with uds_client(d2.socket_path) as c:
            gen = c.get("/v1/slices").json()["generation"]
            r = c.post("/v1/assign", json={"request_id": f"rv-{time.time()}", "generation": gen, "leased": "revoke",
                                           "moves": [{"slice_id": sid, "from": "research", "to": "training"}]})
            assert r.status_code == 200, r.text
            revoked = True
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        if revoked:
            with uds_client(d2.socket_path) as c:
                gen = c.get("/v1/slices").json()["generation"]
                c.post("/v1/assign", json={"request_id": f"gb-{time.time()}", "generation": gen,
                                           "moves": [{"slice_id": sid, "from": "training", "to": "research"}]})
    assert p.returncode == 8, err
    assert re.search(r"n2 \(rank 1\) lost its lease: node n2: lease lease-\w+ on node \S+ was revoked: a reassignment took "
                     r"its slices \(gpuctl reassign --revoke\): stopping n1", err), err
    assert "exiting 8 (LEASE_REVOKED)" in err
    for pid in pids.values():
        try:
            os.kill(pid, 0)
            alive = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[-1].split()[0] != "Z"
        except OSError:
            alive = False
        assert not alive, pid
