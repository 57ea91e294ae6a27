"""Issue 17 item 3: a multi-node `gpuctl run --native --gpus 2` on CPU. Two simulated gpuctld
daemons, one reached locally and one through a real sshd, each lending research one whole GPU;
the job is a `torchrun`-launched gloo all-reduce (torch's own launcher, no flags: the rendezvous
comes from the environment gpuctl sets). Checked: the sum on every rank, the environment each
node gets (its GPU UUID, the rendezvous variables), the prefixed output, a crashing rank ending
the job with both leases freed, Ctrl-C ending every rank, and the multi-GPU lease refusals."""

from __future__ import annotations

import json
import re
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from daemon_proc import REPO_ROOT, start_daemon, uds_client
from fleet_fixtures import (cli_process, daemon_slices, local_node, run_cli, ssh_cli_args, sshd_node,
                            write_fleet_config)
from waiting import gone, wait_for

torch = pytest.importorskip("torch", reason="the torchrun job tests need torch (CI installs torch==2.13.0)")

pytestmark = pytest.mark.sshd

ALLREDUCE = textwrap.dedent("""
    import os, sys, time
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    print(f"rank {rank}/{world} pid {os.getpid()} sum {t.item():g} node_rank {os.environ['NODE_RANK']} "
          f"gpus {os.environ['CUDA_VISIBLE_DEVICES']}", flush=True)
    print(f"rank {rank} says hello on stderr", file=sys.stderr, flush=True)
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "crash" and os.environ["NODE_RANK"] == "1":
        os._exit(3)
    if mode in ("crash", "hang"):
        time.sleep(120)  # rank 0 would wait here for ever: gpuctl must end it
    dist.destroy_process_group()
""")


def _give_gpu0(sock: Path) -> str:
    """Assign GPU 0 (whole) of the daemon to research; returns its UUID."""
    with uds_client(sock) as c:
        st = c.get("/v1/status").json()
        g0 = st["gpus"][0]["identity"]["uuid"]
        sids = [s["id"] for s in daemon_slices(sock).values() if s["gpu_uuid"] == g0]
        r = c.post("/v1/assign", json={"request_id": "give", "generation": st["generation"], "moves": [
            {"slice_id": sid, "from": "unassigned", "to": "research"} for sid in sids]})
        assert r.status_code == 200, r.text
    return g0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """n1 (local transport) and n2 (through a real sshd), 2 simulated GPUs each, GPU 0 research's."""
    from sshd import SshServer, sshd_available

    if not sshd_available():
        pytest.skip("needs /usr/sbin/sshd and ssh-keygen")
    tmp = tmp_path_factory.mktemp("job")
    d1 = start_daemon(tmp, gpus=2, seed=11, name="n1", extra_args=["--native-grace", "2"])
    d2 = start_daemon(tmp, gpus=2, seed=12, name="n2", extra_args=["--native-grace", "2"])
    try:
        g1, g2 = _give_gpu0(d1.socket_path), _give_gpu0(d2.socket_path)
        with SshServer(session_env={"PYTHONPATH": str(REPO_ROOT)}) as sshd:
            cfg = write_fleet_config(tmp / "fleet.toml", {"n1": local_node(d1.socket_path),
                                                           "n2": sshd_node(d2.socket_path)}, departments={})
            script = tmp / "allreduce.py"
            script.write_text(ALLREDUCE)
            yield {"daemons": (d1, d2), "gpus": (g1, g2), "script": str(script),
                   "args": list(ssh_cli_args(cfg, sshd))}
    finally:
        d1.stop()
        d2.stop()


def leases(fleet) -> list[list[dict]]:
    out = []
    for d in fleet["daemons"]:
        with uds_client(d.socket_path) as c:
            out.append(c.get("/v1/leases").json()["leases"])
    return out


@pytest.fixture
def args(fleet):
    """The global flags; after the test, asserts no lease is left on either node (and ends any)."""
    yield fleet["args"]
    left = leases(fleet)
    for d, ls in zip(fleet["daemons"], left):
        with uds_client(d.socket_path) as c:
            for lease in ls:
                c.delete(f"/v1/leases/{lease['id']}")
    assert left == [[], []], f"leases left behind: {left}"


def torchrun(fleet, *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", fleet["script"], *extra]


RANK_LINE = re.compile(r"^\[(n[12])\] rank (\d)/(\d) pid (\d+) sum (\S+) node_rank (\d) gpus (\S+)$", re.M)


@pytest.mark.parametrize("order", [[], ["--nodes", "n2,n1"]], ids=["local-node-first", "ssh-node-first"])
def test_two_node_gloo_allreduce_sum_is_right_on_every_rank(fleet, args, order):
    """ssh-node-first: rank 0 (MASTER_ADDR, the port found free over SSH) is the sshd node."""
    r = run_cli(*args, "run", "--native", "--dept", "research", "--gpus", "2", *order, "--", *torchrun(fleet),
                timeout_s=120)
    assert r.code == 0, r.stderr
    ranks = {m[1]: m for m in RANK_LINE.findall(r.stdout)}
    assert sorted(ranks) == ["0", "1"], r.stdout
    gpu = dict(zip(("n1", "n2"), fleet["gpus"]))
    first, second = ("n2", "n1") if order else ("n1", "n2")
    # rank 0 on the first node (MASTER_ADDR), rank 1 on the other; 1 + 2 = 3 on both
    assert ranks["0"][0] == first and ranks["0"][5] == "0" and ranks["0"][6] == gpu[first]
    assert ranks["1"][0] == second and ranks["1"][5] == "1" and ranks["1"][6] == gpu[second]
    assert all(m[2] == "2" and m[4] == "3" for m in ranks.values())
    assert f"[{first}] rank 0 says hello on stderr" in r.stderr and f"[{second}] rank 1 says hello on stderr" in r.stderr
    assert "placement: 2 GPU(s) of research on 2 node(s), 1 per node" in r.stderr
    assert re.search(r"rendezvous: MASTER_ADDR=127\.0\.0\.1 MASTER_PORT=\d+ NNODES=2 NPROC_PER_NODE=1", r.stderr)
    assert r.stderr.count("released lease") == 2


def test_environment_of_each_node(fleet, args):
    """Each node's program gets its lease's GPU UUID and the same rendezvous, its own NODE_RANK,
    plain and as torchrun's PET_* defaults."""
    show = ("import json, os; print(json.dumps({k: os.environ[k] for k in sorted(os.environ) if k.startswith("
            "('MASTER_', 'NNODES', 'NODE_RANK', 'NPROC_', 'PET_', 'CUDA_VISIBLE'))}))")
    r = run_cli(*args, "run", "--native", "--dept", "research", "--gpus", "2", "--", sys.executable, "-c", show)
    assert r.code == 0, r.stderr
    envs = {line[1:3]: json.loads(line.split("] ", 1)[1]) for line in r.stdout.splitlines()}
    port = envs["n1"]["MASTER_PORT"]
    for node, rank, gpu in (("n1", "0", fleet["gpus"][0]), ("n2", "1", fleet["gpus"][1])):
        common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "NNODES": "2", "NODE_RANK": rank,
                  "NPROC_PER_NODE": "1"}
        assert envs[node] == {"CUDA_VISIBLE_DEVICES": gpu, **common, **{f"PET_{k}": v for k, v in common.items()}}


def test_a_crashing_rank_ends_the_job_and_frees_both_leases(fleet, args):
    """Rank 1 (n2) dies after the all-reduce; rank 0 would sleep 120 s: gpuctl stops n1's torchrun,
    returns n2's exit status and releases both leases."""
    t0 = time.monotonic()
    r = run_cli(*args, "run", "--native", "--dept", "research", "--gpus", "2", "--grace", "3", "--",
                *torchrun(fleet, "crash"), timeout_s=120)
    assert time.monotonic() - t0 < 60
    ranks = {m[1]: m for m in RANK_LINE.findall(r.stdout)}
    assert {m[4] for m in ranks.values()} == {"3"}, r.stdout
    assert r.code == 1, r.stderr  # torchrun's status when a worker failed (the worker's own 3 is in its log)
    assert "n2 (rank 1) ended with exit status 1: stopping n1" in r.stderr
    assert "the job failed on n2: exit status 1" in r.stderr
    assert wait_for(lambda: gone(int(ranks["0"][3])), 10)
    assert leases(fleet) == [[], []]
    assert "could not release" not in r.stderr


def test_ctrl_c_ends_every_rank(fleet, args):
    pids: list[int] = []
    with cli_process(*args, "run", "--native", "--dept", "research", "--gpus", "2", "--grace", "3", "--",
                     *torchrun(fleet, "hang")) as p:
        for _ in range(2):
            m = RANK_LINE.match(p.stdout.readline().strip())
            assert m, "a rank did not report"
            pids.append(int(m[4]))
        assert [len(x) for x in leases(fleet)] == [1, 1]
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    assert p.returncode != 0, err
    assert all(wait_for(lambda pid=pid: gone(pid), 10) for pid in pids)
    assert leases(fleet) == [[], []]
    assert err.count("released lease") == 2


def test_dry_run_shows_the_placement_and_leases_nothing(fleet, args):
    r = run_cli(*args, "run", "--native", "--dept", "research", "--gpus", "2", "--dry-run", "--json")
    assert r.code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["nnodes"] == 2 and doc["nproc_per_node"] == 1
    assert [(n["node"], n["node_rank"], n["gpu_uuids"]) for n in doc["nodes"]] == [
        ("n1", 0, [fleet["gpus"][0]]), ("n2", 1, [fleet["gpus"][1]])]
    r = run_cli(*args, "run", "--native", "--dept", "research", "--gpus", "2", "--nodes", "n2,n1", "--dry-run")
    assert r.code == 0, r.stderr
    assert r.stdout.splitlines()[1].startswith("  rank 0 n2: GPU 0")


@pytest.mark.parametrize("flags, code, words", [
    (["--gpus", "1.5"], 2, "--gpus 1.5: a multi-GPU job takes whole GPUs"),
    (["--slices", "2", "--per-node", "1"], 2, "--slices: a multi-GPU job takes whole GPUs"),
    (["--gpus", "0.5", "--per-node", "1"], 2, "--gpus 0.5: a multi-GPU job takes whole GPUs"),
    (["--gpus", "3", "--nodes", "n1,n2"], 2, "--gpus 3 do not split evenly over the 2 nodes of --nodes"),
    (["--gpus", "2", "--nodes", "n1,n9"], 2, "--nodes: unknown node 'n9' (known: n1, n2)"),
    (["--gpus", "4"], 4, "no placement of 4 whole GPU(s) of 'research' (the same number on each node); "
                         "idle whole GPUs of research: n1: GPU 0; n2: GPU 0"),
], ids=["fraction", "slices", "fraction-per-node", "uneven", "unknown-node", "too-many"])
def test_refusals_name_the_flag_and_hold_nothing(fleet, args, flags, code, words):
    r = run_cli(*args, "run", "--native", "--dept", "research", *flags, "--", "true")
    assert r.code == code, r.stderr
    assert words in r.stderr
    assert leases(fleet) == [[], []]


def test_all_or_nothing_when_the_second_node_refuses(fleet, args):
    """n2's GPU is taken by another client between placement and grant: n1's lease is released."""
    d1, d2 = fleet["daemons"]
    with uds_client(d2.socket_path) as c:
        other = c.post("/v1/leases", json={"request_id": "other", "department": "research", "owner": "x@y",
                                           "ttl_s": 60, "gpus": 1, "attach": "native"}).json()
    try:
        # both nodes named: placement sees n2's GPU leased and says so without leasing on n1
        r = run_cli(*args, "run", "--native", "--dept", "research", "--gpus", "2", "--", "true")
        assert r.code == 4 and "n2: none" in r.stderr, r.stderr
        assert leases(fleet)[0] == []
    finally:
        with uds_client(d2.socket_path) as c:
            c.delete(f"/v1/leases/{other['lease']['id']}")
