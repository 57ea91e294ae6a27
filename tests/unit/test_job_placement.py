"""Issue 17 item 2: placement of multi-GPU jobs (gpuctl.fleet.job.place): fewest nodes first, the
same number of GPUs on each node, then the GPUs of a node that share the fastest link (NVLink
before PCIe), whole idle GPUs of the department only; and the NVML topology behind the links
(nvmlDeviceGetP2PStatus / nvmlDeviceGetTopologyCommonAncestor through the fake NVML)."""

from __future__ import annotations

import pynvml
import pytest

from fake_nvml import FakeNvml
from gpuctl.fleet.job import JobError, Placement, pick_gpus, place, whole_gpus
from gpuctl.model import FleetSnapshot, GpuIdentity, GpuStatus, NodeStatus, Slice, slice_id


def node(name: str, n: int, dept: str = "research", *, links: dict[tuple[int, int], str] | None = None,
         leased: tuple[int, ...] = (), split: tuple[int, ...] = (), other: tuple[int, ...] = (),
         reachable: bool = True) -> NodeStatus:
    """A node of `n` GPUs owned by `dept`; `leased` / `split` (in halves) / `other` (owned by
    "training") GPU indices; `links` (i, j) -> GPU_LINKS name."""
    uuids = [f"GPU-{name}-{i}" for i in range(n)]
    peer: dict[int, dict[str, str]] = {}
    for (i, j), link in (links or {}).items():
        peer.setdefault(i, {})[uuids[j]] = link
        peer.setdefault(j, {})[uuids[i]] = link
    gpus = []
    for i, u in enumerate(uuids):
        owner = "training" if i in other else dept
        if i in split:
            slices = [Slice(slice_id(u, k), u, 0.5, 2**30, 0.5, owner) for k in range(2)]
        else:
            slices = [Slice(slice_id(u, 0), u, 1.0, 2**31, 1.0, owner, lease_id="lease-x" if i in leased else None)]
        gpus.append(GpuStatus(GpuIdentity(u, i, "sim", peer_links=peer.get(i)), None, slices))
    return NodeStatus(name=name, reachable=reachable, gpus=gpus if reachable else [],
                      error=None if reachable else "connection refused")


def shape(p: Placement) -> list[tuple[str, int, tuple[int, ...], str | None]]:
    return [(x.node, x.rank, x.gpu_indices, x.link) for x in p.parts]


def test_fewest_nodes_first():
    snap = FleetSnapshot([node("a", 2), node("b", 4), node("c", 4)])
    assert shape(place(snap, "research", 4)) == [("b", 0, (0, 1, 2, 3), None)]
    # 8 GPUs: no node has 8; two nodes of 4 (a has 2): b and c
    assert shape(place(snap, "research", 8)) == [("b", 0, (0, 1, 2, 3), None), ("c", 1, (0, 1, 2, 3), None)]
    # 2 GPUs fit on a, b and c alike: the first in fleet-config order
    assert shape(place(snap, "research", 2)) == [("a", 0, (0, 1), None)]


def test_same_number_on_every_node():
    """6 GPUs over nodes of 4, 4 and 2 idle: not 4+2 (torchrun needs NPROC_PER_NODE everywhere):
    3 on each of two nodes."""
    snap = FleetSnapshot([node("a", 2), node("b", 4), node("c", 4)])
    assert shape(place(snap, "research", 6)) == [("b", 0, (0, 1, 2), None), ("c", 1, (0, 1, 2), None)]
    with pytest.raises(JobError) as e:
        place(snap, "research", 5)  # 5 x 1 needs five nodes, 1 x 5 a node of five
    assert e.value.code == "insufficient_slices"
    assert str(e.value) == ("no placement of 5 whole GPU(s) of 'research' (the same number on each node); idle whole "
                            "GPUs of research: a: GPU 0, GPU 1; b: GPU 0, GPU 1, GPU 2, GPU 3; c: GPU 0, GPU 1, "
                            "GPU 2, GPU 3")


def test_nvlink_before_pcie_within_a_node():
    # GPUs 0-1 on one PCIe switch, 2-3 joined by NVLink, the rest across the host bridge
    links = {(0, 1): "pcie_switch", (2, 3): "nvlink", (0, 2): "system", (0, 3): "system", (1, 2): "system",
             (1, 3): "system"}
    snap = FleetSnapshot([node("a", 4, links=links)])
    assert shape(place(snap, "research", 2)) == [("a", 0, (2, 3), "nvlink")]
    # with 2 or 3 taken, the PCIe pair is the best left
    snap = FleetSnapshot([node("a", 4, links=links, leased=(3,))])
    assert shape(place(snap, "research", 2)) == [("a", 0, (0, 1), "pcie_switch")]


def test_the_node_with_the_faster_link_wins_a_tie():
    slow = node("a", 2, links={(0, 1): "system"})
    fast = node("b", 2, links={(0, 1): "nvlink"})
    assert shape(place(FleetSnapshot([slow, fast]), "research", 2)) == [("b", 0, (0, 1), "nvlink")]


def test_only_idle_whole_gpus_of_the_department():
    n = node("a", 4, leased=(0,), split=(1,), other=(2,))
    assert [g.index for g in whole_gpus(n, "research")] == [3]
    with pytest.raises(JobError, match=r"idle whole GPUs of research: a: GPU 3$"):
        place(FleetSnapshot([n]), "research", 2)


def test_per_node_and_nodes():
    snap = FleetSnapshot([node("a", 4), node("b", 4), node("c", 4)])
    assert shape(place(snap, "research", 4, per_node=2)) == [("a", 0, (0, 1), None), ("b", 1, (0, 1), None)]
    assert shape(place(snap, "research", 2, nodes=["c", "a"])) == [("c", 0, (0,), None), ("a", 1, (0,), None)]
    for kwargs, words in (
        ({"per_node": 3}, "--gpus 4 is not a multiple of --per-node 3"),
        ({"nodes": ["a", "b", "c"]}, "--gpus 4 do not split evenly over the 3 nodes of --nodes (torchrun starts the same number of "
                                   "ranks on each node)"),
        ({"nodes": ["a", "zz"]}, "--nodes: unknown node(s) zz (known: a, b, c)"),
        ({"nodes": ["a", "a"]}, "--nodes: a node is named twice (a,a)"),
        ({"nodes": ["a", "b"], "per_node": 1}, "--per-node 1 x 2 node(s) of --nodes is not --gpus 4"),
    ):
        with pytest.raises(JobError) as e:
            place(snap, "research", 4, **kwargs)
        assert e.value.code == "invalid_request" and str(e.value) == words


def test_named_node_without_room_and_unreachable_nodes():
    snap = FleetSnapshot([node("a", 1), node("b", 4), node("c", 0, reachable=False)])
    with pytest.raises(JobError) as e:
        place(snap, "research", 4, nodes=["a", "b"])
    assert e.value.code == "insufficient_slices" and "(on a, b)" in str(e.value)
    with pytest.raises(JobError) as e:
        place(snap, "research", 8)
    assert e.value.code == "unreachable" and str(e.value).endswith("; unreachable: c (connection refused)")


def test_pick_gpus_exact_and_greedy_agree_on_a_two_island_board(monkeypatch):
    # 8 GPUs: NVLink islands {0,1,2,3} and {4,5,6,7}, PCIe host bridge between them
    links = {}
    for i in range(8):
        for j in range(i + 1, 8):
            links[(i, j)] = "nvlink" if (i < 4) == (j < 4) else "host_bridge"
    n = node("a", 8, links=links, leased=(0,))
    gpus = whole_gpus(n, "research")
    exact, rank = pick_gpus(gpus, 4)
    assert [g.index for g in exact] == [4, 5, 6, 7] and rank == 0
    import gpuctl.fleet.job as job

    monkeypatch.setattr(job, "MAX_COMBINATIONS", 1)
    greedy, rank = pick_gpus(gpus, 4)
    assert [g.index for g in greedy] == [4, 5, 6, 7] and rank == 0


def test_nvml_backend_reports_peer_links(monkeypatch):
    from gpuctl.backends.nvml import NvmlBackend

    fake = FakeNvml({"gpu_count": 3, "topology": {"0,1": "nvlink", "0,2": pynvml.NVML_TOPOLOGY_SYSTEM}}).install(
        monkeypatch)
    b = NvmlBackend()
    try:
        ids = b.gpus()
        u = [g.uuid for g in ids]
        assert ids[0].peer_links == {u[1]: "nvlink", u[2]: "system"}
        assert ids[1].peer_links == {u[0]: "nvlink"}  # 1-2 answered by neither query: left out
        assert ids[2].peer_links == {u[0]: "system"}
        assert fake.calls_of("nvmlDeviceGetTopologyCommonAncestor") == 2  # not for the NVLink pair
    finally:
        b.close()


def test_nvml_backend_without_topology_queries_reports_none(monkeypatch):
    from gpuctl.backends.nvml import NvmlBackend

    fake = FakeNvml({"gpu_count": 2})
    fake.install(monkeypatch)

    def missing(*a):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetP2PStatus", missing)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTopologyCommonAncestor", missing)
    b = NvmlBackend()
    try:
        assert [g.peer_links for g in b.gpus()] == [None, None]
    finally:
        b.close()


def test_peer_links_survive_the_status_json_and_do_not_change_equality():
    g = GpuIdentity("GPU-a", 0, "x", peer_links={"GPU-b": "nvlink"})
    assert GpuIdentity.from_json(g.to_json()) == g and GpuIdentity.from_json(g.to_json()).peer_links == {"GPU-b": "nvlink"}
    assert g == GpuIdentity("GPU-a", 0, "x") and hash(g) == hash(GpuIdentity("GPU-a", 0, "x"))


def test_prefixed_stream_whole_lines_partial_tail_and_long_lines():
    import io
    import threading

    from gpuctl.fleet.job import PrefixedStream

    buf = io.BytesIO()
    s = PrefixedStream(buf, "n1", threading.Lock(), max_line=8)
    s.write(b"ab")
    assert buf.getvalue() == b""  # a partial line waits for its end
    s.write(b"c\nde\nf")
    assert buf.getvalue() == b"[n1] abc\n[n1] de\n"
    s.write(b"0123456789")  # "f" + 10 bytes: past max_line, written in pieces
    assert buf.getvalue().endswith(b"[n1] f0123456\n")
    s.close()
    assert buf.getvalue() == b"[n1] abc\n[n1] de\n[n1] f0123456\n[n1] 789\n"


def test_rendezvous_env_and_master_address():
    from types import SimpleNamespace

    from gpuctl.fleet.job import master_address, rendezvous_env

    env = rendezvous_env(master_addr="10.0.0.5", master_port=29500, nnodes=2, node_rank=1, nproc_per_node=8)
    plain = {"MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500", "NNODES": "2", "NODE_RANK": "1", "NPROC_PER_NODE": "8"}
    assert env == {**plain, **{f"PET_{k}": v for k, v in plain.items()}}
    ssh = SimpleNamespace(transport="ssh", host="gpu-01.lab")
    local = SimpleNamespace(transport="local", host=None)
    assert master_address(ssh, {"data_address": "10.0.0.5"}) == "10.0.0.5"
    assert master_address(ssh, {"data_address": "[fd00::5]"}) == "fd00::5"
    assert master_address(ssh, {"data_address": "0.0.0.0"}) == "gpu-01.lab"  # a bind-all is no address
    assert master_address(ssh, {}) == "gpu-01.lab"
    assert master_address(local, {}) == "127.0.0.1"
